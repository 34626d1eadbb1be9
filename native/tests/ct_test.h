/* Minimal test counters; every test binary ends with "N passed, N failed". */
#ifndef CT_TEST_H
#define CT_TEST_H
#include <stdio.h>
static int ct_pass, ct_fail;
#define CHECK(cond, ...)                                          \
  do {                                                            \
    if (cond) ct_pass++;                                          \
    else {                                                        \
      ct_fail++;                                                  \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);        \
      fprintf(stderr, __VA_ARGS__);                               \
      fprintf(stderr, "\n");                                      \
    }                                                             \
  } while (0)
#define CT_SUMMARY() (printf("%d passed, %d failed\n", ct_pass, ct_fail), ct_fail ? 1 : 0)
#endif
