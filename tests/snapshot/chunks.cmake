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
  # Mutant SNAP_CURSOR_STALE (docs/verification.md, "Issue 38 (second
  # round)"): a segment's release leaves a snapshot's place in the segment
  # list on it; the pieces case must fail. Built like pp_logic_mutant's
  # (tests/CMakeLists.txt), with the snapshot checker.
  if(PINPOOL_SANITIZE STREQUAL "none")
    add_library(pinpool_snap_cursor_stale STATIC ${PINPOOL_SOURCES})
    target_compile_definitions(pinpool_snap_cursor_stale PRIVATE
      PINPOOL_BUILDING PINPOOL_MUTANT_SNAP_CURSOR_STALE)
    target_include_directories(pinpool_snap_cursor_stale PUBLIC
      ${PROJECT_SOURCE_DIR}/include PRIVATE ${PROJECT_SOURCE_DIR}/src)
    target_link_libraries(pinpool_snap_cursor_stale PUBLIC Threads::Threads
      ${CMAKE_DL_LIBS})
    set_target_properties(pinpool_snap_cursor_stale PROPERTIES C_STANDARD 11
      C_STANDARD_REQUIRED ON C_VISIBILITY_PRESET hidden
      EXPORT_COMPILE_COMMANDS OFF)
    add_executable(test_snapshot_chunks_snap_cursor_stale test_chunks.c
      ${PROJECT_SOURCE_DIR}/tests/testutil.c)
    target_link_libraries(test_snapshot_chunks_snap_cursor_stale PRIVATE
      pinpool_snap_cursor_stale pp_snapcheck PkgConfig::CMOCKA
      Threads::Threads)
    target_include_directories(test_snapshot_chunks_snap_cursor_stale PRIVATE
      ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/src)
    set_target_properties(test_snapshot_chunks_snap_cursor_stale PROPERTIES
      C_STANDARD 11 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF)
    add_test(NAME mutant_snap_cursor_stale
      COMMAND test_snapshot_chunks_snap_cursor_stale
              ${CMAKE_CURRENT_SOURCE_DIR}/example_chunks.json)
    set_tests_properties(mutant_snap_cursor_stale PROPERTIES TIMEOUT 180
      PASS_REGULAR_EXPRESSION "between the pieces|no release moved the cursor"
      LABELS "unit;mutant" ENVIRONMENT_MODIFICATION "PINPOOL_CONF=unset:")
  endif()
endif()
