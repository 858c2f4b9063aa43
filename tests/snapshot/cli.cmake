# `pinpool snapshot summary` and `pinpool snapshot diff` (test_cli.py): the
# numbers of the hand-written example, diffs, accounting mismatches, every
# kind of malformed input and usage error (exit codes and messages), a large
# synthetic snapshot, and real snapshots written by pp_snapgen.
set(_pp_cli_cases summary json diff identity errors usage large)
# Sanitizers make parsing several times slower: fewer history entries for
# the large case there (still 100,000 blocks).
if(PINPOOL_SANITIZE STREQUAL "none" OR PINPOOL_SANITIZE STREQUAL "")
  set(_pp_cli_extra --large-entries 1000000)
else()
  set(_pp_cli_extra --large-entries 250000)
endif()
if(TARGET pp_snapgen)
  list(APPEND _pp_cli_cases snapgen)
  list(APPEND _pp_cli_extra --snapgen $<TARGET_FILE:pp_snapgen>)
endif()

foreach(_case IN LISTS _pp_cli_cases)
  add_test(NAME snapshot_cli_${_case}
    COMMAND ${PP_SYSTEM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/test_cli.py
            --cli $<TARGET_FILE:pinpool_cli>
            --example ${CMAKE_CURRENT_SOURCE_DIR}/example.json
            --work ${PP_ARTIFACTS}/snapshot_cli
            ${_pp_cli_extra}
            ${_case})
  set_tests_properties(snapshot_cli_${_case} PROPERTIES
    TIMEOUT 300
    LABELS "snapshot;cli"
    ENVIRONMENT_MODIFICATION "PINPOOL_CONF=unset:")
endforeach()
# The large case writes and parses up to 80 MB of JSON: keep it off the
# CPUs that other tests time.
set_tests_properties(snapshot_cli_large PROPERTIES RUN_SERIAL TRUE)
