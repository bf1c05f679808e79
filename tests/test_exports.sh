#!/usr/bin/env bash
# Only mpu's API leaves its libraries: every symbol a library exports is an
# mpu_ name (never an mpu__ internal, never another prefix) declared in a
# public header, an ifunc resolver of one (GCC exports a target_clones
# function's resolver beside it), or libmpu's sibling table (comm/base/sibling.h,
# the one door its sibling libraries and tool use, named after the version).
# Under AddressSanitizer each exported variable also has its __odr_asan.NAME
# indicator (ASan's one-definition check); it is read as NAME.
# The internals marked MPU_SIBLING_API (core/error.h) are exactly those the
# siblings reach through the table (comm/base/sibling_calls.c defines them).
# usage: test_exports.sh SOURCE_DIR LIBRARY...
set -euo pipefail
src=$1
shift
marked=$(grep -rhE '^MPU_SIBLING_API ' "$src"/src --include='*.h' | grep -oE 'mpu__[a-z0-9_]+\(' |
         tr -d '(' | sort -u)
lent=$(grep -E '^[a-z]' "$src"/src/comm/base/sibling_calls.c | grep -oE 'mpu__[a-z0-9_]+\(' |
       tr -d '(' | sort -u)
if [[ -z $lent || $marked != "$lent" ]]; then
  echo "marked MPU_SIBLING_API, not in comm/base/sibling_calls.c: $(comm -23 <(echo "$marked") <(echo "$lent") | tr '\n' ' ')" >&2
  echo "in comm/base/sibling_calls.c, not marked MPU_SIBLING_API: $(comm -13 <(echo "$marked") <(echo "$lent") | tr '\n' ' ')" >&2
  exit 1
fi
echo "the sibling table: $(wc -w <<<"$lent") internals, each marked MPU_SIBLING_API"
declared=" $(grep -ohw 'mpu_[a-z0-9_]*' "$src"/include/mpu/*.h | sort -u | tr '\n' ' ') "
bad=0
for lib in "$@"; do
  names=$(nm -D --defined-only "$lib" | awk '{print $3}')
  for name in $names; do
    base=${name%.resolver}
    base=${base#__odr_asan.}
    if [[ ! $base =~ ^mpu_[a-z0-9] ]]; then
      echo "$lib: exports $name (not mpu's API)" >&2
      bad=1
    elif [[ $base =~ ^mpu_sibling_table_[0-9]+_[0-9]+_[0-9]+_r[0-9]+$ ]]; then
      [[ $(basename "$lib") == libmpu.so* ]] || { echo "$lib: exports $name" >&2; bad=1; }
    elif [[ $declared != *" $base "* ]]; then
      echo "$lib: exports $name, in no public header" >&2
      bad=1
    fi
  done
  echo "$lib: $(wc -w <<<"$names") symbols"
done
exit $bad
