# cmake -DOUT=header.h -DFILES="a.html;b.js" -P embed.cmake
# Writes a header with one byte array per file and an accessor returning it
# as a std::string_view: index.html -> flowrun::console::assets::index_html().
set(text "// Generated from runtime/console/page by runtime/console/embed.cmake: do not edit.\n")
string(APPEND text "#pragma once\n#include <string_view>\n\nnamespace flowrun::console::assets {\n")
foreach(f IN LISTS FILES)
  get_filename_component(name ${f} NAME)
  string(MAKE_C_IDENTIFIER ${name} id)
  file(READ ${f} hex HEX)
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
  string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" bytes "${bytes}")
  string(APPEND text "\n// ${name}\ninline constexpr unsigned char ${id}_data[] = {\n${bytes}0x00};\n")
  string(APPEND text "inline std::string_view ${id}() {\n  return {reinterpret_cast<const char*>(${id}_data), sizeof ${id}_data - 1};\n}\n")
endforeach()
string(APPEND text "\n}  // namespace flowrun::console::assets\n")
# Write only when changed, so that dependents are not rebuilt for nothing.
if(EXISTS ${OUT})
  file(READ ${OUT} old)
  if(old STREQUAL text)
    return()
  endif()
endif()
file(WRITE ${OUT} "${text}")
