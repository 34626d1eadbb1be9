/* clustertool-reducer's start on x86-64 glibc, so the program loads on glibc 2.17+
 * (see ct_glibc_compat.h, which this file also gets through -include).
 *
 * The program's first call, crt1.o's call to __libc_start_main, comes from the C
 * library's own object, where the compat header's .symver cannot reach: linked on glibc
 * 2.34+ it binds __libc_start_main@GLIBC_2.34. The Makefile links the reducer with
 * --wrap=__libc_start_main, so that call lands here, and this file's reference carries
 * GLIBC_2.2.5 (the header's .symver).
 *
 * 2.34's crt1.o passes no `init`, because 2.34's __libc_start_main runs the program's
 * constructors itself when `init` is NULL; before 2.34 a NULL `init` meant none ran (the
 * program's crt1.o brought __libc_csu_init). So `init` is supplied here, doing what
 * __libc_csu_init did for a dynamically linked program (ld.so runs .preinit_array):
 * _init, then .init_array in order. Both old and new glibc call it the same way. */
#include <stddef.h>

#ifdef CT_GLIBC_COMPAT_X86_64
typedef void (*ct_init_fn)(int, char**, char**);
extern ct_init_fn __init_array_start[] __attribute__((visibility("hidden")));
extern ct_init_fn __init_array_end[] __attribute__((visibility("hidden")));
extern void _init(void);

int __libc_start_main(int (*main)(int, char**, char**), int argc, char** argv, ct_init_fn init, void (*fini)(void),
                      void (*rtld_fini)(void), void* stack_end);
int __wrap___libc_start_main(int (*main)(int, char**, char**), int argc, char** argv, ct_init_fn init,
                             void (*fini)(void), void (*rtld_fini)(void), void* stack_end);

static void ct_run_constructors(int argc, char** argv, char** envp) {
  _init();
  size_t n = (size_t)(__init_array_end - __init_array_start);
  for (size_t i = 0; i < n; i++) __init_array_start[i](argc, argv, envp);
}

int __wrap___libc_start_main(int (*main)(int, char**, char**), int argc, char** argv, ct_init_fn init,
                             void (*fini)(void), void (*rtld_fini)(void), void* stack_end) {
  /* a crt1.o from before 2.34 passes its own __libc_csu_init: keep it */
  return __libc_start_main(main, argc, argv, init ? init : ct_run_constructors, fini, rtld_fini, stack_end);
}
#else
typedef int ct_glibc_start_unused_t;   /* ISO C wants a declaration in every file */
#endif
