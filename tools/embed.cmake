# Turn the file IN into OUT, a C file defining
#   const char snap_viewer_page[];  (NUL-terminated)
#   const unsigned long snap_viewer_page_len;
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n)
math(EXPR len "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
file(WRITE "${OUT}"
  "/* Generated from ${IN} by tools/embed.cmake. */\n"
  "extern const char snap_viewer_page[];\n"
  "extern const unsigned long snap_viewer_page_len;\n"
  "const char snap_viewer_page[] = {${body} 0x00};\n"
  "const unsigned long snap_viewer_page_len = ${len}UL;\n")
