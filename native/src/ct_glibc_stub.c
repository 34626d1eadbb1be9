/* Link-time stand-in for glibc's libdl.so.2 or libpthread.so.0 as they were before 2.34
 * (CT_GLIBC_STUB names the list in ct_glibc_compat.h): the plugin libraries and the
 * reducer link against it so their GLIBC_2.2.5 references name that file, which glibc
 * before 2.30 insists on (see ct_glibc_compat.h). Never installed or loaded: at run time
 * the system's file of that name (or, from glibc 2.34, libc) provides the functions.
 * Built -nostdlib with ct_glibc_stub.map, which puts every symbol at GLIBC_2.2.5. */
#include "ct_glibc_compat.h"

#define CT_STUB_FN(name) void name(void); void name(void) {}
CT_GLIBC_STUB(CT_STUB_FN)
