# `pinpool snapshot torch` (test_torch.py): the pickle is loaded with
# Python's pickle module and compared with the JSON; its opcodes are decoded
# as memory_viz's JavaScript unpickler does; its trace is replayed with the
# viewer's rules; and, where Debian's python3-torch imports, the functions
# of torch.cuda._memory_viz that read snapshots are run on it.
# With `chunks` (issue 21) each chunk becomes a segment, tiled by the blocks
# of the segments carved from it and its free gaps: checked on
# example_chunks.json, its busy-pool and malformed variants, and the real
# snapshots below.
#   snapshot_torch_example  example.json, usage errors, malformed input,
#                           entries the block states contradict;
#                           example_chunks.json and its variants
#   snapshot_torch_snapgen  real snapshots written by pp_snapgen
#   snapshot_torch_written  the busy-pool snapshots test_snapshot keeps
#                           (writer.cmake), when they are there
set(_pp_torch_cases example)
set(_pp_torch_extra
  --written ${CMAKE_CURRENT_BINARY_DIR}/written)
if(TARGET pp_snapgen)
  list(APPEND _pp_torch_cases snapgen)
  list(APPEND _pp_torch_extra --snapgen $<TARGET_FILE:pp_snapgen>)
endif()
if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/writer.cmake)
  list(APPEND _pp_torch_cases written)
endif()

foreach(_case IN LISTS _pp_torch_cases)
  add_test(NAME snapshot_torch_${_case}
    COMMAND ${PP_SYSTEM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/test_torch.py
            --pinpool $<TARGET_FILE:pinpool_cli>
            --example ${CMAKE_CURRENT_SOURCE_DIR}/example.json
            --example-chunks ${CMAKE_CURRENT_SOURCE_DIR}/example_chunks.json
            --workdir ${PP_ARTIFACTS}/snapshot_torch
            ${_pp_torch_extra}
            ${_case})
  set_tests_properties(snapshot_torch_${_case} PROPERTIES
    TIMEOUT 300
    LABELS "unit"
    ENVIRONMENT_MODIFICATION "PINPOOL_CONF=unset:")
endforeach()
# Converts what test_snapshot wrote; without that fixture it finds nothing.
if(TEST snapshot_torch_written)
  set_tests_properties(snapshot_torch_written PROPERTIES
    FIXTURES_REQUIRED pp_snapshots_written)
endif()
