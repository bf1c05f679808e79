#!/usr/bin/env bash
# The communicator layer's walls, checked on the tree:
#  - no file outside src/comm/ includes comm_internal.h or a backend's own
#    header (threads/, the MPI and NCCL sources' headers) or compares a
#    communicator's backend name: what differs between backends is asked of
#    mpu_comm_capabilities (the tests may name backends: they test them);
#  - the old kind numbering (a second enum tied to mpu_collective by +1) and
#    the backends' repacking of the checked call are gone;
#  - what a collective is lives in one table (src/comm/base/collective.h):
#    a file of src/ or tools/ switches on the collective kind at most once
#    (a backend: from the kind to its library's call);
#  - libmpu needs nothing but libc, libm and pthreads;
#  - the checkpoint only consumes shards (mpu/shard.h): src/checkpoint/ calls
#    no FSDP or optimizer function, public or internal (mpu__adamw_*: the
#    optimizer's rules are checked where an optimizer takes its options),
#    includes no train/ header and reads no optimizer field, so a new
#    strategy is saved by describing its shards, with no code here.
# Usage: test_layering.sh SOURCE_DIR LIBMPU
set -euo pipefail
src=$1 lib=$(realpath "$2")
deps=$(ldd "$lib")
cd "$src"
fail=0
outside=$(git ls-files 'src/*.c' 'src/*.h' 'tools/*.c' 'tools/*.h' 'examples/*.c' 'fuzz/*.c' 2>/dev/null |
  grep -v '^src/comm/' || true)
[ -n "$outside" ] || outside=$(find src tools examples fuzz -name '*.[ch]' | grep -v '^src/comm/')
if grep -nE '#include "(comm/comm_internal\.h|comm/threads/|comm/rendezvous\.h|comm/base/signature\.h|comm/base/module\.h)' $outside; then
  echo "^ outside src/comm/: a backend's or the base's internals" >&2
  fail=1
fi
if grep -nE 'mpu_comm_backend\([^)]*\)\s*,\s*"|strn?cmp\([^;]*mpu_comm_backend' $outside; then
  echo "^ outside src/comm/: a backend named by its name (ask mpu_comm_capabilities)" >&2
  fail=1
fi
if grep -nE 'mpu__comm_is_fake|mpu__fake_group_described|mpu__nccl_device|mpu__kind\b|MPU__(ALL_REDUCE|BARRIER)|mpu__sig_make|\btcall\b' -r src tools tests --include='*.[ch]'; then
  echo "^ the old call round trip (second kind enum, repacked calls, backend-specific hooks)" >&2
  fail=1
fi
sources=$(git ls-files 'src/*.[ch]' 'tools/*.[ch]' 2>/dev/null || true)
[ -n "$sources" ] || sources=$(find src tools -name '*.[ch]')
# each switch is numbered as it opens; a `case MPU_COLL_...` belongs to the latest one
if awk 'FNR == 1 { sw = 0 }
        /^[[:space:]]*\/?\*/ { next }
        /switch[[:space:]]*\(/ { sw++ }
        /case[[:space:]]+MPU_COLL_/ { k = FILENAME SUBSEP sw; if (!(k in seen)) { seen[k] = 1; n[FILENAME]++ } }
        END { bad = 0
              for (f in n) if (n[f] > 1) { printf "%s: %d switches on the collective kind\n", f, n[f]; bad = 1 }
              exit !bad }' $sources; then
  echo "^ a second switch on the collective kind in one file (read the row: src/comm/base/collective.h)" >&2
  fail=1
fi
if echo "$deps" | grep -Ei 'mpi|cuda|nccl|blas|open-pal'; then
  echo "^ libmpu loads more than libc, libm and pthreads" >&2
  fail=1
fi
if grep -nE 'mpu_fsdp_|mpu_optimizer_|mpu_param_buffer_|mpu__(adamw|grad|param|step|describe|fsdp|optimizer)|#include "train/|->(m|v|main|dp_rank|distributed)\b' \
    src/checkpoint/*.[ch]; then
  echo "^ src/checkpoint/ reaching into FSDP or the optimizer (describe shards and add them)" >&2
  fail=1
fi
[ $fail = 0 ] && echo "1 passed, 0 failed"
exit $fail
