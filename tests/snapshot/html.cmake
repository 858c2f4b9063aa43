# `pinpool snapshot html` and the viewer page, loaded in headless Chromium
# (Debian's chromium package; the test fails, saying so, without it).
# test_html.py checks the command line, the embedding of the JSON, the
# rendered page (blocks drawn, no script errors, hover tooltip) for
# example.json, hostile strings, a 100,000-block snapshot, the chunk map
# of example_chunks.json (free gaps, a segment crossing two chunks, the
# words "free in chunks") and, when built, a pp_snapgen snapshot, and
# saves a screenshot to
# ${PP_ARTIFACTS}/snapshot-viewer.png.
set(_pp_html_args
  --pinpool $<TARGET_FILE:pinpool_cli>
  --example ${CMAKE_CURRENT_SOURCE_DIR}/example.json
  --example-chunks ${CMAKE_CURRENT_SOURCE_DIR}/example_chunks.json
  --artifacts ${PP_ARTIFACTS})
if(TARGET pp_snapgen)
  list(APPEND _pp_html_args --snapgen $<TARGET_FILE:pp_snapgen>)
endif()
add_test(NAME snapshot_html
  COMMAND ${PP_SYSTEM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/test_html.py
          ${_pp_html_args})
# Chromium keeps both CPUs of a small machine busy for a few seconds per
# page: tell ctest so, rather than letting it race timing-sensitive tests.
set_tests_properties(snapshot_html PROPERTIES
  TIMEOUT 180
  LABELS "unit"
  PROCESSORS 2)
