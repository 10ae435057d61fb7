# The package's version follows the library's (AC_INIT in configure.ac);
# fusedrope.version() reports the library actually linked.
__version__ = "0.2.0"
