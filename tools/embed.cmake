# Turn the viewer page into OUT, a C file defining
#   const char snap_viewer_page[];  (NUL-terminated)
#   const unsigned long snap_viewer_page_len;
# IN is tools/viewer/viewer.html; its style sheet CSS and script JS go back
# into it in place of its <link> and <script src> lines, so that the page
# the tool writes is one file (viewer.html says why). The work is done on
# the files' bytes in hex: their text holds ';', '[' and '\' that CMake's
# strings would take apart.
file(READ "${IN}" hex HEX)
file(READ "${CSS}" css HEX)
file(READ "${JS}" js HEX)
string(HEX "<link rel=\"stylesheet\" href=\"viewer.css\">" link)
string(HEX "<script src=\"viewer.js\"></script>" script)
string(HEX "<style>\n" style_open)
string(HEX "</style>" style_close)
string(HEX "<script>\n" script_open)
string(HEX "</script>" script_close)
foreach(tag link script)
  string(FIND "${hex}" "${${tag}}" at)
  math(EXPR odd "${at} % 2")
  if(at LESS 0 OR odd)
    message(FATAL_ERROR "${IN}: no ${tag} line to put the file back in place of")
  endif()
endforeach()
string(REPLACE "${link}" "${style_open}${css}${style_close}" hex "${hex}")
string(REPLACE "${script}" "${script_open}${js}${script_close}" hex "${hex}")
string(LENGTH "${hex}" n)
math(EXPR len "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
file(WRITE "${OUT}"
  "/* Generated from ${IN}, ${CSS} and ${JS} by tools/embed.cmake. */\n"
  "extern const char snap_viewer_page[];\n"
  "extern const unsigned long snap_viewer_page_len;\n"
  "const char snap_viewer_page[] = {${body} 0x00};\n"
  "const unsigned long snap_viewer_page_len = ${len}UL;\n")
