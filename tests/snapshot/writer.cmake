# The writer: tests/test_snapshot.c (cmocka + jansson) writes snapshots of
# busy pools, checks each one (snapcheck.c) and keeps them in a directory;
# snapshot_schema then validates every kept file against
# docs/snapshot.schema.json with python3-jsonschema.
pkg_check_modules(PP_JANSSON REQUIRED IMPORTED_TARGET jansson)
add_library(pp_snapcheck STATIC snapcheck.c)
target_link_libraries(pp_snapcheck PUBLIC PkgConfig::PP_JANSSON)

add_executable(test_snapshot ${PROJECT_SOURCE_DIR}/tests/test_snapshot.c)
target_link_libraries(test_snapshot PRIVATE pp_testutil pp_snapcheck)
target_include_directories(test_snapshot PRIVATE ${PROJECT_SOURCE_DIR}/tests)
set(pp_snapshot_dir ${CMAKE_CURRENT_BINARY_DIR}/written)
add_test(NAME test_snapshot_clean
  COMMAND ${CMAKE_COMMAND} -E rm -rf ${pp_snapshot_dir})
add_test(NAME test_snapshot COMMAND test_snapshot)
set_tests_properties(test_snapshot_clean PROPERTIES FIXTURES_SETUP pp_snapdir_clean)
set_tests_properties(test_snapshot PROPERTIES
  TIMEOUT 180 LABELS "unit" RUN_SERIAL TRUE
  FIXTURES_REQUIRED pp_snapdir_clean
  FIXTURES_SETUP pp_snapshots_written
  ENVIRONMENT "PP_SNAPSHOT_DIR=${pp_snapshot_dir};PP_SNAPSHOT_SECONDS=1.5"
  ENVIRONMENT_MODIFICATION "PINPOOL_CONF=unset:")
add_test(NAME snapshot_schema
  COMMAND ${PP_SYSTEM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/validate_schema.py
          ${PP_SNAPSHOT_SCHEMA} ${pp_snapshot_dir}
          $<TARGET_FILE:pp_snapgen>)
set_tests_properties(snapshot_schema PROPERTIES
  TIMEOUT 300 LABELS "unit" FIXTURES_REQUIRED pp_snapshots_written)
