# mneme CMake package: find_package(mneme) then add_mneme(<target>).
#
#   cmake -B build -S . -DCMAKE_PREFIX_PATH=$(mneme config cmakedir)
#
#   find_package(mneme REQUIRED)
#   add_executable(app app.cu)
#   add_mneme(app)            # or add_mneme(app STRICT): fail the build when the IR cannot be made
#
# add_mneme() leaves the target's build as it is (nvcc compiles and links it);
# after the target is linked it compiles the device code of the target's CUDA
# sources with clang to per-kernel LLVM bitcode and embeds it in the
# `.mneme_bitcode` section of the target's file, which `mneme record` stores
# with the recording (RecordedIR_<static>.bc) for the LLVM tier of replay.
#
# Variables: MNEME_CXX / MNEME_CC (the compiler wrappers, an alternative to
# add_mneme for whole builds), MNEME_INCLUDE_DIR, MNEME_PYTHON (the Python that
# runs the embedding step; any Python >= 3.10, it uses the standard library only).

get_filename_component(_MNEME_PACKAGE_DIR "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
get_filename_component(_MNEME_PYTHONPATH "${_MNEME_PACKAGE_DIR}/.." ABSOLUTE)

set(MNEME_CXX "${_MNEME_PACKAGE_DIR}/toolchain/bin/mneme-c++")
set(MNEME_CC "${_MNEME_PACKAGE_DIR}/toolchain/bin/mneme-cc")
set(MNEME_INCLUDE_DIR "${_MNEME_PACKAGE_DIR}/toolchain/include")

if(NOT MNEME_PYTHON)
  find_package(Python3 3.10 COMPONENTS Interpreter QUIET)
  if(NOT Python3_Interpreter_FOUND)
    set(mneme_FOUND FALSE)
    set(mneme_NOT_FOUND_MESSAGE "mneme needs a Python >= 3.10 interpreter for add_mneme(); set MNEME_PYTHON")
    return()
  endif()
  set(MNEME_PYTHON "${Python3_EXECUTABLE}" CACHE FILEPATH "Python that runs mneme's IR embedding step")
endif()

# The sm_XX the device IR is built for: the target's CUDA_ARCHITECTURES, else
# CMAKE_CUDA_ARCHITECTURES, else sm_90 (the replay retargets the IR anyway).
function(_mneme_ir_arch target out_var)
  get_target_property(_archs ${target} CUDA_ARCHITECTURES)
  if(NOT _archs OR _archs MATCHES "NOTFOUND")
    set(_archs "${CMAKE_CUDA_ARCHITECTURES}")
  endif()
  set(_arch "sm_90")
  foreach(_a IN LISTS _archs)
    if(_a MATCHES "^([0-9]+[af]?)")
      set(_arch "sm_${CMAKE_MATCH_1}")
      break()
    endif()
  endforeach()
  set(${out_var} "${_arch}" PARENT_SCOPE)
endfunction()

function(add_mneme target)
  cmake_parse_arguments(PARSE_ARGV 1 _MNEME "STRICT" "" "")
  if(NOT TARGET ${target})
    message(FATAL_ERROR "add_mneme: ${target} is not a target; call add_mneme() after add_executable/add_library")
  endif()
  get_target_property(_sources ${target} SOURCES)
  get_target_property(_source_dir ${target} SOURCE_DIR)
  set(_cuda_sources "")
  foreach(_src IN LISTS _sources)
    get_source_file_property(_lang "${_src}" LANGUAGE)
    if(_src MATCHES "\\.cu$" OR _lang STREQUAL "CUDA")
      if(NOT IS_ABSOLUTE "${_src}")
        set(_src "${_source_dir}/${_src}")
      endif()
      list(APPEND _cuda_sources "${_src}")
    endif()
  endforeach()
  if(NOT _cuda_sources)
    message(WARNING "add_mneme(${target}): the target has no CUDA sources; nothing to embed")
    return()
  endif()
  _mneme_ir_arch(${target} _arch)
  set(_strict "")
  if(_MNEME_STRICT)
    set(_strict "MNEME_IR_STRICT=1")
  endif()
  set(_incs "$<TARGET_PROPERTY:${target},INCLUDE_DIRECTORIES>")
  set(_defs "$<TARGET_PROPERTY:${target},COMPILE_DEFINITIONS>")
  set(_std "$<TARGET_PROPERTY:${target},CUDA_STANDARD>")
  add_custom_command(TARGET ${target} POST_BUILD
    COMMAND ${CMAKE_COMMAND} -E env "PYTHONPATH=${_MNEME_PYTHONPATH}" ${_strict}
            "${MNEME_PYTHON}" -m mneme.toolchain embed -o "$<TARGET_FILE:${target}>" "-arch=${_arch}"
            "$<$<BOOL:${_incs}>:-I$<JOIN:${_incs},;-I>>"
            "$<$<BOOL:${_defs}>:-D$<JOIN:${_defs},;-D>>"
            "$<$<BOOL:${_std}>:-std=c++${_std}>"
            ${_cuda_sources}
    COMMAND_EXPAND_LISTS
    VERBATIM
    COMMENT "mneme: embedding the kernels' LLVM IR into ${target}")
endfunction()

set(mneme_FOUND TRUE)
