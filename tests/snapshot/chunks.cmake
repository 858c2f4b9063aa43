# The arena's chunks in snapshots (test_chunks.c): snapcheck_chunks on
# quiescent pools of several configurations (the segments and free ranges
# tile the chunks, the stats' arena fields agree), on the hand-written
# example_chunks.json, and damaged copies of it and of a real snapshot,
# each of which must fail for the reason expected. Needs pp_snapcheck
# (writer.cmake).
if(TARGET pp_snapcheck)
  add_executable(test_snapshot_chunks test_chunks.c)
  target_link_libraries(test_snapshot_chunks PRIVATE pp_testutil pp_snapcheck
                        Threads::Threads)
  target_include_directories(test_snapshot_chunks PRIVATE
                             ${PROJECT_SOURCE_DIR}/tests
                             ${PROJECT_SOURCE_DIR}/src) # the test hook
  add_test(NAME snapshot_chunks
    COMMAND test_snapshot_chunks ${CMAKE_CURRENT_SOURCE_DIR}/example_chunks.json)
  set_tests_properties(snapshot_chunks PROPERTIES
    TIMEOUT 180 LABELS "unit"
    ENVIRONMENT_MODIFICATION "PINPOOL_CONF=unset:")
endif()
