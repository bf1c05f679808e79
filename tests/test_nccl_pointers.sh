#!/bin/bash
# No test of the NCCL backend turns the double's pointer checks off: every
# NCCL test hands NCCL device, managed or registered memory, as on a GPU
# (tests/nccl_double/switches.h, "pointers"). Usage: test_nccl_pointers.sh <tests dir>
set -u
dir=${1:?tests dir}
hits=$(grep -rnE 'forgive\("[a-z_,]*pointers|MPU_DOUBLE_FORGIVE=[a-z_,]*pointers' \
  "$dir"/*.c "$dir"/*.h "$dir"/gpu "$dir"/conformance "$dir"/CMakeLists.txt 2>/dev/null)
if [ -n "$hits" ]; then
  echo "the double's pointer checks are turned off here:"
  echo "$hits"
  exit 1
fi
echo "pointer checks on in every NCCL test"
