/* Forced into every translation unit of the two plugin libraries and clustertool-reducer
 * (`-include`, see the Makefile) so that they load on glibc 2.17 and later on x86-64
 * (Ubuntu 20.04 has 2.31, Amazon Linux 2 2.26), whichever glibc built them.
 *
 * glibc 2.34 moved libpthread and libdl into libc and gave the moved functions a new
 * version, GLIBC_2.34, next to the old one (GLIBC_2.2.5 on x86-64), which stays in libc
 * as an alias of the same code. A program built against 2.34+ binds the new version and
 * an older glibc refuses to load it. The .symver lines below bind the old version.
 *
 * Where the old version is looked for matters too: the link records the file each
 * version came from, and glibc before 2.30 fails a lookup ("symbol pthread_create
 * version GLIBC_2.2.5 not defined in file libc.so.6 with link time reference") when it
 * meets that file first without the symbol. So the Makefile links against stand-ins
 * named libpthread.so.0 and libdl.so.2 (ct_glibc_stub.c, defining the lists below),
 * and the built files name those, as if built on an old glibc. glibc 2.30+ searches
 * every loaded file, and from 2.34 finds the functions in libc.
 *
 * Only functions whose GLIBC_2.2.5 and GLIBC_2.34 versions are the same code (same
 * address in glibc 2.36's libc.so.6) are listed: not pthread_kill or timer_*, whose old
 * versions behave differently. A symbol a file does not use costs nothing.
 * tests/check_glibc.sh (run by `make test`) fails when a built file needs more than 2.17.
 *
 * No #include here: this comes before a file's own `#define _GNU_SOURCE`, and reading
 * <features.h> now would fix the feature set without it. So __GLIBC__ is known only when
 * the file is included late; otherwise glibc's own header name, looked up without being
 * read, tells its headers are in use (musl has none of gnu/). */
#ifndef CT_GLIBC_COMPAT_H
#define CT_GLIBC_COMPAT_H

#if defined(__x86_64__) && !defined(__GLIBC__) && defined(__has_include)
#if __has_include(<gnu/libc-version.h>)
#define CT_GLIBC_COMPAT_X86_64 1
#endif
#elif defined(__x86_64__) && defined(__GLIBC__)
#define CT_GLIBC_COMPAT_X86_64 1
#endif

/* In libdl.so.2 and libpthread.so.0 at GLIBC_2.2.5 before glibc 2.34. */
#define CT_GLIBC_LIBDL(X) X(dlopen) X(dlsym) X(dlvsym) X(dlclose) X(dlerror) X(dladdr)
#define CT_GLIBC_LIBPTHREAD(X)                                                                                   \
  X(pthread_create) X(pthread_join) X(pthread_detach) X(pthread_cancel) X(pthread_once) X(pthread_key_create)    \
  X(pthread_key_delete) X(pthread_getspecific) X(pthread_setspecific) X(pthread_attr_setstacksize)               \
  X(pthread_attr_getstacksize) X(pthread_mutex_trylock) X(pthread_mutexattr_init) X(pthread_mutexattr_settype)   \
  X(pthread_mutexattr_destroy) X(pthread_rwlock_init) X(pthread_rwlock_destroy) X(pthread_rwlock_rdlock)         \
  X(pthread_rwlock_wrlock) X(pthread_rwlock_unlock) X(sem_init) X(sem_destroy) X(sem_post) X(sem_wait)           \
  X(sem_trywait) X(sem_timedwait)

#if defined(CT_GLIBC_COMPAT_X86_64) && !defined(CT_GLIBC_STUB)
#define CT_GLIBC_OLD(name) __asm__(".symver " #name "," #name "@GLIBC_2.2.5");
CT_GLIBC_LIBDL(CT_GLIBC_OLD)
CT_GLIBC_LIBPTHREAD(CT_GLIBC_OLD)
/* libc's own: a program's start (see ct_glibc_start.c) */
CT_GLIBC_OLD(__libc_start_main)
#undef CT_GLIBC_OLD
#endif

#endif
