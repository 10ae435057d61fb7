# Consumers of the installed library (tests/install/run.sh, run by
# `make installcheck` and so by `make distcheck`), and the CMake package files
# they use.

# CMake package: generated here rather than by configure so that the paths
# are those of `make install prefix=...` too.  Installed paths, like the .pc.
cmakeconfigdir = $(libdir)/cmake/fusedrope
cmakeconfig_DATA = cmake/fusedrope-config.cmake cmake/fusedrope-config-version.cmake
CLEANFILES += $(cmakeconfig_DATA)
EXTRA_DIST += cmake/fusedrope-config.cmake.in cmake/fusedrope-config-version.cmake.in

# '|' delimits the sed expressions: no path or flag here contains one.
fr_cmake_subst = sed \
	-e 's|@prefix[@]|$(prefix)|g' \
	-e 's|@libdir[@]|$(libdir)|g' \
	-e 's|@includedir[@]|$(includedir)|g' \
	-e 's|@PACKAGE_VERSION[@]|$(PACKAGE_VERSION)|g' \
	-e 's|@OPENMP_LIBS[@]|$(OPENMP_LIBS)|g' \
	-e 's|@THREAD_LIBS[@]|$(THREAD_LIBS)|g' \
	-e 's|@CUDA_LIBS[@]|$(CUDA_LIBS)|g'

cmake/fusedrope-config.cmake: $(srcdir)/cmake/fusedrope-config.cmake.in Makefile
	$(AM_V_GEN)$(MKDIR_P) cmake && \
	$(fr_cmake_subst) $(srcdir)/cmake/fusedrope-config.cmake.in > $@.tmp && mv $@.tmp $@
cmake/fusedrope-config-version.cmake: $(srcdir)/cmake/fusedrope-config-version.cmake.in Makefile
	$(AM_V_GEN)$(MKDIR_P) cmake && \
	$(fr_cmake_subst) $(srcdir)/cmake/fusedrope-config-version.cmake.in > $@.tmp && mv $@.tmp $@

EXTRA_DIST += tests/install/run.sh tests/install/consumer.h tests/install/wrap.h \
	tests/install/wrap.c tests/install/c99_main.c tests/install/cxx_main.cc \
	tests/install/dlopen_main.c tests/install/cmake-version-check.cmake \
	tests/install/cmake-config/CMakeLists.txt tests/install/cmake-pkgconfig/CMakeLists.txt

# cmake, run by `make installcheck` (tests/install/run.sh skips the CMake
# consumers when there is none).
CMAKE = cmake

installcheck-local:
	CC='$(CC)' CXX='$(CXX)' PKG_CONFIG='$(PKG_CONFIG)' CMAKE='$(CMAKE)' \
	prefix='$(prefix)' libdir='$(libdir)' pkgconfigdir='$(pkgconfigdir)' \
	PACKAGE_VERSION='$(PACKAGE_VERSION)' top_srcdir='$(top_srcdir)' \
	$(SHELL) $(top_srcdir)/tests/install/run.sh
