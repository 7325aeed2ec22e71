# FmhaJaxFfi.cmake: builds fmha.jax's XLA FFI handler (python/fmha/_ffi/
# fmha_jax_ffi.c, C11 against XLA's C API) when the Python package is built,
# against the XLA FFI headers of the jaxlib that the build's Python imports,
# and installs it in
# the package with fmha_jax_ffi.json (the jaxlib version and the XLA FFI
# API version it was built for; fmha.jax checks them before loading it).
# Without jax it is skipped: fmha.jax then compiles the handler on first use.

find_package(Python3 COMPONENTS Interpreter)
if(NOT Python3_Interpreter_FOUND)
  message(STATUS "fmha: no Python interpreter found; the JAX FFI handler is not built")
  return()
endif()

# jax.ffi.include_dir() is <jaxlib>/include; the jaxlib path is the fallback
# when only jaxlib is importable.
set(_fmha_probe [=[
import os
import jaxlib
try:
    import jax.ffi
    inc = jax.ffi.include_dir()
except Exception:
    inc = os.path.join(os.path.dirname(os.path.abspath(jaxlib.__file__)), "include")
try:
    from jaxlib.version import __version__ as ver
except Exception:
    ver = getattr(jaxlib, "__version__", "unknown")
print(inc + ";" + ver, end="")
]=])
execute_process(COMMAND ${Python3_EXECUTABLE} -c "${_fmha_probe}"
                RESULT_VARIABLE _fmha_rc OUTPUT_VARIABLE _fmha_out ERROR_QUIET)
if(NOT _fmha_rc EQUAL 0)
  message(STATUS "fmha: jax is not importable by ${Python3_EXECUTABLE}; the JAX FFI handler is not built "
                 "(fmha.jax will compile it on first use)")
  return()
endif()
list(GET _fmha_out 0 FMHA_JAX_INCLUDE)
list(GET _fmha_out 1 FMHA_JAXLIB_VERSION)
set(_fmha_capi ${FMHA_JAX_INCLUDE}/xla/ffi/api/c_api.h)
if(NOT EXISTS ${_fmha_capi})
  message(STATUS "fmha: ${_fmha_capi} not found; the JAX FFI handler is not built")
  return()
endif()
file(STRINGS ${_fmha_capi} _fmha_major REGEX "^#define XLA_FFI_API_MAJOR [0-9]+")
file(STRINGS ${_fmha_capi} _fmha_minor REGEX "^#define XLA_FFI_API_MINOR [0-9]+")
string(REGEX REPLACE ".* ([0-9]+)$" "\\1" _fmha_major "${_fmha_major}")
string(REGEX REPLACE ".* ([0-9]+)$" "\\1" _fmha_minor "${_fmha_minor}")

add_library(fmha_jax_ffi MODULE python/fmha/_ffi/fmha_jax_ffi.c)
set_target_properties(fmha_jax_ffi PROPERTIES
  PREFIX "" C_STANDARD 11 C_STANDARD_REQUIRED ON C_VISIBILITY_PRESET hidden
  INSTALL_RPATH "$ORIGIN/..")   # libfmha.so sits in the package, one level up
target_include_directories(fmha_jax_ffi SYSTEM PRIVATE ${FMHA_JAX_INCLUDE})
target_link_libraries(fmha_jax_ffi PRIVATE fmha Threads::Threads)
# only fmha_ffi_* leave the handler
target_link_options(fmha_jax_ffi PRIVATE "-Wl,--version-script=${CMAKE_CURRENT_SOURCE_DIR}/cmake/fmha_jax_ffi.map")
set_property(TARGET fmha_jax_ffi APPEND PROPERTY LINK_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/cmake/fmha_jax_ffi.map)
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/fmha_jax_ffi.json
     "{\"jaxlib\": \"${FMHA_JAXLIB_VERSION}\", \"ffi_api\": [${_fmha_major}, ${_fmha_minor}]}\n")
install(TARGETS fmha_jax_ffi LIBRARY DESTINATION fmha/_ffi)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/fmha_jax_ffi.json DESTINATION fmha/_ffi)
message(STATUS "fmha: JAX FFI handler for jaxlib ${FMHA_JAXLIB_VERSION} (XLA FFI API ${_fmha_major}.${_fmha_minor})")
