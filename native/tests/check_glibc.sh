#!/bin/sh
# The plugin libraries, the reducer and collnet_bench_lite must load on glibc 2.17 and later on x86-64
# (src/ct_glibc_compat.h): fails when one of them needs a newer GLIBC_ symbol version.
# glibc before 2.30 also wants each old-version reference to name the file that had the
# function then (libpthread.so.0, libdl.so.2), not libc.so.6: checked for pthread_create
# and dlopen, one from each list in the header.
# Usage: check_glibc.sh BUILD_DIR. Ends with "N passed, N failed" like the C tests;
# elsewhere (another arch, another C library, a sanitizer build, no objdump) it says why
# with SKIP and counts nothing.
B=${1:-build}
MAX=2.17
pass=0; fail=0
if ! command -v objdump >/dev/null 2>&1; then
  echo "SKIP glibc versions: no objdump (binutils)"
  echo "0 passed, 0 failed"; exit 0
fi
for f in "$B/libnccl-net-clustertool.so" "$B/libnccl-tuner-clustertool.so" "$B/clustertool-reducer" "$B/collnet_bench_lite"; do
  if [ ! -f "$f" ]; then
    echo "FAIL $f: missing"; fail=$((fail + 1)); continue
  fi
  if objdump -p "$f" | grep -q 'NEEDED.*libasan'; then
    echo "SKIP glibc versions of $f: sanitizer build (built without the compat header)"; continue
  fi
  if ! objdump -f "$f" | grep -q 'x86-64'; then
    echo "SKIP glibc versions of $f: not x86-64 (other arches build without the compat header)"; continue
  fi
  need=$(objdump -T "$f" | grep -o 'GLIBC_[0-9.]*' | sed 's/^GLIBC_//' | sort -uV | tail -1)
  if [ -z "$need" ]; then
    echo "SKIP glibc versions of $f: no GLIBC_ symbol versions (not built against glibc)"; continue
  fi
  newest=$(printf '%s\n%s\n' "$MAX" "$need" | sort -V | tail -1)
  if [ "$newest" = "$MAX" ]; then
    pass=$((pass + 1))
  else
    echo "FAIL $f needs GLIBC_$need (at most GLIBC_$MAX):" \
      $(objdump -T "$f" | grep -E "GLIBC_$need[^0-9.]" | awk '{print $NF}' | sort -u)
    fail=$((fail + 1))
  fi
  for pair in pthread_create:libpthread.so.0 dlopen:libdl.so.2; do
    sym=${pair%%:*}; lib=${pair#*:}
    objdump -T "$f" | grep -q " $sym\$" || continue
    if objdump -p "$f" | grep -q "required from $lib:"; then
      pass=$((pass + 1))
    else
      echo "FAIL $f: $sym's version is not required from $lib (glibc before 2.30 would not find it)"
      fail=$((fail + 1))
    fi
  done
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
