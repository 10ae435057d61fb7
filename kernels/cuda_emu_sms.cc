/*
 * cuda_emu_sms.cc - the SM count the emulated device reports
 * (kernels/cuda_emu.h declares it), defined once for every program that
 * links the emulated kernels (tests/libfremu.a): tests set it to see other
 * launch shapes, and a program may link both the apply and the norm
 * wrappers (tests/cuda_emu_wrap.c, tests/cuda_norm_emu_wrap.c).
 */
extern "C" {
int fr_emu_sms = 132;
}
