/*
 * small-call.c - time of one tiny forward call (1 token, H heads of 128
 * float32, in place, table cache): what a decode step pays per call besides
 * the rotation itself.  Best of 5 runs of N calls.
 *
 * cc -O2 bench/small-call.c $(pkg-config --cflags --libs fusedrope)
 * ./a.out [N=200000] [H=8] [num_threads=0]
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <fusedrope.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  int n = argc>1?atoi(argv[1]):200000; int heads = argc>2?atoi(argv[2]):8;
  fusedrope_cache_config cfg; fusedrope_cache *c;
  fusedrope_cache_config_init(&cfg, FUSEDROPE_ROPE_DEFAULT, 128, 4096, 10000);
  if (argc>3) cfg.num_threads = atoi(argv[3]);
  if (fusedrope_cache_create(&cfg, FUSEDROPE_DEVICE_CPU, &c)) { puts(fusedrope_last_error()); return 1; }
  float *q = calloc(heads*128, 4);
  fusedrope_tensor t = fusedrope_tensor_sbhd(q, FUSEDROPE_FLOAT32, 1, 1, heads, 128);
  double best=1e9;
  for (int r=0;r<5;r++){ double t0=now();
    for(int i=0;i<n;i++) fusedrope_forward(c, FUSEDROPE_NEOX, NULL, &t, &t, NULL);
    double dt=(now()-t0)/n; if(dt<best)best=dt;}
  printf("%.1f ns/call (1 token, %d heads x 128 f32)\n", best*1e9, heads);
  return 0;
}
