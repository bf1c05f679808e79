# The tests that run the mpu tool, included by tests/CMakeLists.txt where the
# tool is built (it needs the layers, and they need OpenBLAS).
add_test(NAME test_cli COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_cli.sh $<TARGET_FILE:mpu_tool>)
# demo gpt --save/--load across layouts, mpu ckpt inspect/merge and their refusals
set(MPU_CKPT_QUICK)
if(MPU_SANITIZE) # the sanitizers' runs are slow: two of the four layouts
  set(MPU_CKPT_QUICK --quick)
endif()
# demo gpt --overlap-grad-reduce: losses bit-equal to the run without, its report, refusals
add_test(NAME demo_gpt_overlap COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_overlap_demo.sh
  ${MPU_CKPT_QUICK} $<TARGET_FILE:mpu_tool>)
set_tests_properties(demo_gpt_overlap PROPERTIES TIMEOUT 300)
add_test(NAME ckpt_demo COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_ckpt_demo.sh ${MPU_CKPT_QUICK}
  $<TARGET_FILE:mpu_tool>)
set_tests_properties(ckpt_demo PROPERTIES TIMEOUT 900)
# the merged file and the rank files in Python's safetensors
add_test(NAME ckpt_python COMMAND ${MPU_PYENV}/bin/python ${CMAKE_CURRENT_SOURCE_DIR}/test_ckpt_python.py
  $<TARGET_FILE:mpu_tool> ${PROJECT_SOURCE_DIR})
set_tests_properties(ckpt_python PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77 FIXTURES_REQUIRED pyenv)
# mpu ckpt export: transformers' sharded layout, read as transformers and
# torch.distributed.checkpoint (python/mpu_dcp.py) read it, equal to the merge
add_test(NAME ckpt_export COMMAND ${MPU_PYENV}/bin/python ${CMAKE_CURRENT_SOURCE_DIR}/test_ckpt_export.py
  $<TARGET_FILE:mpu_tool> ${PROJECT_SOURCE_DIR})
set_tests_properties(ckpt_export PROPERTIES TIMEOUT 600 FIXTURES_REQUIRED pyenv)
set_tests_properties(test_cli PROPERTIES TIMEOUT 600) # 290 s seen at load 60
# --format json parses in every command, demo and mode whose help offers --format
if(NOT MPU_SANITIZE) # output formatting; the timed modes are slow under the sanitizers
  add_test(NAME format_json COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_format_json.sh
    $<TARGET_FILE:mpu_tool>)
  set_tests_properties(format_json PROPERTIES TIMEOUT 900)
endif()
# what `mpu ckpt` and `mpu bench --csv` read and write: JSON escaped, outputs that are regular
# files and never the checkpoint's own, FIFOs refused without waiting
add_test(NAME ckpt_tool COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_ckpt_tool.sh $<TARGET_FILE:mpu_tool>)
set_tests_properties(ckpt_tool PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
# README.md and docs/ against the --help texts: subcommands, demos, every flag
add_test(NAME docs_match_help COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/test_docs_cli.py
  $<TARGET_FILE:mpu_tool> ${PROJECT_SOURCE_DIR})
set_tests_properties(docs_match_help PROPERTIES TIMEOUT 120)
# the docs' claims in prose against the tool and the docs' own perf-report tables
add_test(NAME docs_claims COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/test_docs_claims.py
  $<TARGET_FILE:mpu_tool> ${PROJECT_SOURCE_DIR})
set_tests_properties(docs_claims PROPERTIES TIMEOUT 300)
# the man pages' sections (made from the --help texts), words free of the project's history in
# help, man pages, docs and comments, and the configure line's MPI version
if(TARGET mpu_man)
  add_test(NAME user_text COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/test_user_text.py
    $<TARGET_FILE:mpu_tool> ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR}/man ${CMAKE_COMMAND})
  set_tests_properties(user_text PROPERTIES TIMEOUT 120)
endif()
# mpu bench --columns nccl-tests: nccl-tests' header, fields, widths, type names and summary
add_test(NAME bench_nccl_columns COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/test_bench_columns.py
  $<TARGET_FILE:mpu_tool>)
set_tests_properties(bench_nccl_columns PROPERTIES TIMEOUT 600) # sanitizer builds: minutes
# mpu plan --flavor core-0.19 against a brute-force model of core_v0.19.0's
# initialize_model_parallel: groups, per-rank getters and refusals
if(NOT MPU_SANITIZE)
  add_test(NAME core019_plan COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/test_core019_plan.py
    $<TARGET_FILE:mpu_tool> 1500)
  set_tests_properties(core019_plan PROPERTIES TIMEOUT 300)
  # mpu plan --schedule against Megatron's schedule loops ported literally
  add_test(NAME schedule_order COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/test_schedule_order.py
    $<TARGET_FILE:mpu_tool>)
  set_tests_properties(schedule_order PROPERTIES TIMEOUT 300)
endif()
# the HTML pictures in headless chromium: click a rank, check the highlighted
# groups and the getters, keep screenshots in the build tree (skipped, 77,
# where chromium is not installed)
if(NOT MPU_SANITIZE)
  add_test(NAME picture_browser COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/test_picture_browser.py
    $<TARGET_FILE:mpu_tool> ${PROJECT_BINARY_DIR}/screenshots)
  set_tests_properties(picture_browser PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77 RUN_SERIAL TRUE)
endif()
