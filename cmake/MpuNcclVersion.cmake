# The NCCL version a nccl.h declares, and the oldest NCCL mpu's backend
# builds against and runs on (docs/gpu.md, "NCCL versions"): ncclCommSplit,
# its config's splitShare and ncclCommInitRankConfig's non-blocking mode are
# 2.18's. The floor is written once, in src/comm/nccl/backend.h, which the
# backend checks against ncclGetVersion at run time. Newer calls are looked up
# in the libnccl.so.2 loaded: ncclAlltoAll from 2.28.3 (without it all_to_all
# is a group of ncclSend/ncclRecv); ncclBfloat16 by name from 2.21 (older
# headers hide it from C; its value 9 is used).
file(STRINGS ${CMAKE_CURRENT_LIST_DIR}/../src/comm/nccl/backend.h mpu_nccl_floor_line
     REGEX "^#define MPU_NCCL_FLOOR ")
string(REGEX MATCH "([0-9]+), *([0-9]+), *([0-9]+)" mpu_nccl_floor_parts "${mpu_nccl_floor_line}")
set(MPU_NCCL_MIN_VERSION "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}.${CMAKE_MATCH_3}")

# out: "MAJOR.MINOR.PATCH" from header's NCCL_MAJOR/MINOR/PATCH, or "" when
# it has none.
function(mpu_nccl_header_version header out)
  file(STRINGS "${header}" lines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH)[ \t]+[0-9]+")
  set(version "")
  foreach(part MAJOR MINOR PATCH)
    if(NOT lines MATCHES "NCCL_${part}[ \t]+([0-9]+)")
      set(${out} "" PARENT_SCOPE)
      return()
    endif()
    list(APPEND version ${CMAKE_MATCH_1})
  endforeach()
  string(REPLACE ";" "." version "${version}")
  set(${out} "${version}" PARENT_SCOPE)
endfunction()
