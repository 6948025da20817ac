# The library graph: one library per folder, declared with deltaserve_library(),
# recorded here and checked by tools/check_layers.py on every build.
#
# Why a checker and not per-library include roots: every library compiles with
# the repository root on its include path (includes are rooted at the repo,
# STYLE.md), so the compiler alone would find any header. Staging each
# library's headers under its own root would make it refuse, but only for the
# files a compiler happens to see (a header that no one in the wrong library
# includes goes unchecked), it cannot say "<mpi.h> only in *_mpi.cc", and it
# moves every diagnostic and IDE jump into build/. The checker reads the graph
# CMake links with (build/layers.json, written below from the same calls), scans
# every .h/.cc/.cu of every library, test folder and benchmark, and fails the
# build naming the file, the line and the folder it may not include. It takes
# well under a second and runs again whenever a source file or the graph changes.
#
# Visibility follows CMake's own rules for usage requirements: a .cc file may
# include headers of its library, its PUBLIC and PRIVATE dependencies and their
# PUBLIC dependencies, transitively; a header only what its library's PUBLIC
# side reaches, because everything that includes it sees only that.

# Layer order (../shared/DESIGN.md): a library may depend only on libraries
# listed before it. runtime/tokenizer needs only common and is used from
# serving up, so it sits between the two.
set(DELTASERVE_LAYERS
    deltaserve_kernels deltaserve_common deltaserve_tokenizer deltaserve_comm
    deltaserve_model deltaserve_engine deltaserve_scheduler deltaserve_proto
    deltaserve_serving deltaserve_launcher)

set_property(GLOBAL PROPERTY DELTASERVE_NODES "")
set(DELTASERVE_CHECKED_FILES "" CACHE INTERNAL "")

# Records a node of the graph for the checker. OWNS: the repo-relative folders
# (ending in /) or files whose headers belong to the node; FILES: the files to
# check (repo-relative); PUBLIC / PRIVATE: the deltaserve nodes it depends on.
# LEAF: an executable or a test folder, which nothing links; its headers are
# its own and see all it depends on.
function(deltaserve_record_node name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "LEAF" "" "OWNS;FILES;PUBLIC;PRIVATE")
  set_property(GLOBAL APPEND PROPERTY DELTASERVE_NODES ${name})
  set_property(GLOBAL PROPERTY DELTASERVE_NODE_${name}_LEAF ${arg_LEAF})
  set_property(GLOBAL PROPERTY DELTASERVE_NODE_${name}_OWNS ${arg_OWNS})
  set_property(GLOBAL PROPERTY DELTASERVE_NODE_${name}_FILES ${arg_FILES})
  set_property(GLOBAL PROPERTY DELTASERVE_NODE_${name}_PUBLIC ${arg_PUBLIC})
  set_property(GLOBAL PROPERTY DELTASERVE_NODE_${name}_PRIVATE ${arg_PRIVATE})
endfunction()

# Splits target names into deltaserve nodes (kept for the graph) and the rest.
function(_deltaserve_internal out)
  set(result)
  foreach(dep ${ARGN})
    if(dep MATCHES "^deltaserve_")
      list(APPEND result ${dep})
    endif()
  endforeach()
  set(${out} ${result} PARENT_SCOPE)
endfunction()

# Fails configuration when `name` depends on a layer at or above its own.
function(_deltaserve_check_order name)
  list(FIND DELTASERVE_LAYERS ${name} own)
  if(own EQUAL -1)
    message(FATAL_ERROR "${name}: not in DELTASERVE_LAYERS (cmake/DeltaserveLayers.cmake)")
  endif()
  foreach(dep ${ARGN})
    list(FIND DELTASERVE_LAYERS ${dep} index)
    if(index EQUAL -1 OR NOT index LESS own)
      message(FATAL_ERROR "${name} may not depend on ${dep}: dependencies point down the "
                          "layers (${DELTASERVE_LAYERS})")
    endif()
  endforeach()
endfunction()

# The C++/CUDA files under a repo-relative folder, repo-relative, recursively.
function(_deltaserve_glob_checked out folder)
  file(GLOB_RECURSE files CONFIGURE_DEPENDS RELATIVE ${CMAKE_SOURCE_DIR}
       ${CMAKE_SOURCE_DIR}/${folder}/*.h ${CMAKE_SOURCE_DIR}/${folder}/*.cc
       ${CMAKE_SOURCE_DIR}/${folder}/*.cu)
  list(SORT files)
  set(${out} ${files} PARENT_SCOPE)
endfunction()

# deltaserve_library(<target> FOLDER <dir> [PUBLIC deps...] [PRIVATE deps...])
#
# A static library of every .cc under <dir>, subfolders included (.cu only in
# a CUDA build; *_mpi.cc only with MPI, *_nccl.cc only with NCCL: they are the
# files that include <mpi.h> / <nccl.h>). Dependencies are target names, as
# for target_link_libraries; the deltaserve_* ones form the checked graph and
# must come earlier in DELTASERVE_LAYERS.
function(deltaserve_library name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "FOLDER;EXCLUDE" "PUBLIC;PRIVATE")
  _deltaserve_internal(public ${arg_PUBLIC})
  _deltaserve_internal(private ${arg_PRIVATE})
  _deltaserve_check_order(${name} ${public} ${private})

  _deltaserve_glob_checked(checked ${arg_FOLDER})
  set(sources ${checked})
  list(FILTER sources INCLUDE REGEX "\\.(cc|cu)$")
  if(arg_EXCLUDE)  # compiled by the caller some other way; still checked
    list(FILTER sources EXCLUDE REGEX "${arg_EXCLUDE}")
  endif()
  if(NOT DELTASERVE_HAVE_CUDA)
    list(FILTER sources EXCLUDE REGEX "\\.cu$")
  endif()
  if(NOT DELTASERVE_HAVE_MPI)
    list(FILTER sources EXCLUDE REGEX "_mpi\\.cc$")
  endif()
  if(NOT DELTASERVE_HAVE_NCCL)
    list(FILTER sources EXCLUDE REGEX "_nccl\\.cc$")
  endif()
  list(TRANSFORM sources PREPEND ${CMAKE_SOURCE_DIR}/)
  if(NOT sources)
    message(FATAL_ERROR "${name}: no sources under ${arg_FOLDER}/")
  endif()
  add_library(${name} STATIC ${sources})
  target_include_directories(${name} PUBLIC ${CMAKE_SOURCE_DIR})
  target_link_libraries(${name} PUBLIC ${arg_PUBLIC} PRIVATE ${arg_PRIVATE})
  add_dependencies(${name} deltaserve_layers)

  deltaserve_record_node(${name} OWNS ${arg_FOLDER}/ FILES ${checked}
                         PUBLIC ${public} PRIVATE ${private})
endfunction()

# Writes build/layers.json (only when it changes) and adds the target that
# checks the tree against it; every deltaserve library depends on that target,
# so no object compiles before the includes are known to be allowed.
function(deltaserve_write_layers)
  get_property(nodes GLOBAL PROPERTY DELTASERVE_NODES)
  # A folder of runtime/ that no library claims would be silently left out of
  # the build: refuse it.
  set(owned)
  foreach(node ${nodes})
    get_property(values GLOBAL PROPERTY DELTASERVE_NODE_${node}_OWNS)
    list(APPEND owned ${values})
  endforeach()
  file(GLOB folders LIST_DIRECTORIES true CONFIGURE_DEPENDS RELATIVE ${CMAKE_SOURCE_DIR}
       ${CMAKE_SOURCE_DIR}/runtime/*)
  foreach(folder ${folders})
    if(IS_DIRECTORY ${CMAKE_SOURCE_DIR}/${folder} AND NOT "${folder}/" IN_LIST owned)
      message(FATAL_ERROR "${folder}/ belongs to no library: add a deltaserve_library() call "
                          "for it to CMakeLists.txt (docs/architecture.md, Libraries and layers)")
    endif()
  endforeach()
  set(json "{\n  \"layers\": [")
  set(sep "")
  foreach(layer ${DELTASERVE_LAYERS})
    string(APPEND json "${sep}\"${layer}\"")
    set(sep ", ")
  endforeach()
  string(APPEND json "],\n  \"nodes\": {")
  set(node_sep "\n")
  set(all_files)
  foreach(node ${nodes})
    get_property(leaf GLOBAL PROPERTY DELTASERVE_NODE_${node}_LEAF)
    if(leaf)
      string(APPEND json "${node_sep}    \"${node}\": {\"leaf\": true, ")
    else()
      string(APPEND json "${node_sep}    \"${node}\": {\"leaf\": false, ")
    endif()
    set(field_sep "")
    foreach(field OWNS FILES PUBLIC PRIVATE)
      get_property(values GLOBAL PROPERTY DELTASERVE_NODE_${node}_${field})
      string(TOLOWER ${field} key)
      string(APPEND json "${field_sep}\"${key}\": [")
      set(sep "")
      foreach(value ${values})
        string(APPEND json "${sep}\"${value}\"")
        set(sep ", ")
      endforeach()
      string(APPEND json "]")
      set(field_sep ", ")
      if(field STREQUAL "FILES")
        list(APPEND all_files ${values})
      endif()
    endforeach()
    string(APPEND json "}")
    set(node_sep ",\n")
  endforeach()
  string(APPEND json "\n  }\n}\n")
  file(CONFIGURE OUTPUT ${CMAKE_BINARY_DIR}/layers.json CONTENT "${json}" @ONLY)

  list(REMOVE_DUPLICATES all_files)
  list(TRANSFORM all_files PREPEND ${CMAKE_SOURCE_DIR}/)
  set(stamp ${CMAKE_BINARY_DIR}/layers.ok)
  add_custom_command(
      OUTPUT ${stamp}
      COMMAND ${DELTASERVE_PYTHON3} ${CMAKE_SOURCE_DIR}/tools/check_layers.py
              --root ${CMAKE_SOURCE_DIR} --graph ${CMAKE_BINARY_DIR}/layers.json
      COMMAND ${CMAKE_COMMAND} -E touch ${stamp}
      DEPENDS ${CMAKE_SOURCE_DIR}/tools/check_layers.py ${CMAKE_BINARY_DIR}/layers.json
              ${all_files}
      COMMENT "Checking includes against the library graph (build/layers.json)"
      VERBATIM)
  add_custom_target(deltaserve_layers DEPENDS ${stamp})
endfunction()
