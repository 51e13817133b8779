# CTest driver (cmake -P): installs the built mpt into a scratch prefix, then configures, builds and
# runs tests/package/consumer against it, exactly as a user project outside the tree would.
#   cmake -DMPT_SOURCE_DIR=<src> -DMPT_BINARY_DIR=<build> -DWORK_DIR=<scratch> [-DCONFIG=Release]
#         -P run_consumer.cmake
cmake_minimum_required(VERSION 3.24)
foreach(var MPT_SOURCE_DIR MPT_BINARY_DIR WORK_DIR)
  if(NOT ${var})
    message(FATAL_ERROR "run_consumer.cmake: pass -D${var}=...")
  endif()
endforeach()
if(NOT EXISTS ${MPT_BINARY_DIR}/CMakeCache.txt)
  message(FATAL_ERROR "run_consumer.cmake: ${MPT_BINARY_DIR} is not a configured mpt build tree")
endif()

set(prefix ${WORK_DIR}/prefix)
set(build ${WORK_DIR}/build)
file(REMOVE_RECURSE ${WORK_DIR})  # never test against a stale install
file(MAKE_DIRECTORY ${WORK_DIR})

# Build the consumer like mpt itself: same compiler, generator and build type.
function(mpt_cache_value name out)
  file(STRINGS ${MPT_BINARY_DIR}/CMakeCache.txt line REGEX "^${name}:[A-Z]+=")
  string(REGEX REPLACE "^${name}:[A-Z]+=" "" line "${line}")
  set(${out} "${line}" PARENT_SCOPE)
endfunction()
mpt_cache_value(CMAKE_GENERATOR generator)
mpt_cache_value(CMAKE_MAKE_PROGRAM make_program)
mpt_cache_value(CMAKE_CXX_COMPILER cxx)
mpt_cache_value(CMAKE_PREFIX_PATH mpt_prefix_path)
if(NOT CONFIG)
  mpt_cache_value(CMAKE_BUILD_TYPE CONFIG)
endif()
if(NOT CONFIG)
  set(CONFIG Release)
endif()

# Runs one step; on failure stops the script with its command line and output.
function(mpt_step name)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out
                  TIMEOUT 900)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "package consumer: ${name} failed (${rc})\n$ ${cmd}\n${out}")
  endif()
  message(STATUS "package consumer: ${name} OK")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

# (a) install
mpt_step(install ${CMAKE_COMMAND} --install ${MPT_BINARY_DIR} --prefix ${prefix} --config ${CONFIG})

# (b) configure the consumer against the installed package only
set(configure_args -S ${MPT_SOURCE_DIR}/tests/package/consumer -B ${build}
    "-DCMAKE_PREFIX_PATH=${prefix};${mpt_prefix_path}" -DCMAKE_BUILD_TYPE=${CONFIG})
if(generator)
  list(APPEND configure_args -G ${generator})
endif()
if(make_program)
  list(APPEND configure_args -DCMAKE_MAKE_PROGRAM=${make_program})
endif()
if(cxx)
  list(APPEND configure_args -DCMAKE_CXX_COMPILER=${cxx})
endif()
mpt_step(configure ${CMAKE_COMMAND} ${configure_args})

# (c) build
mpt_step(build ${CMAKE_COMMAND} --build ${build} --config ${CONFIG})

# (d) run; libmpt is found through the consumer's build RPATH (no LD_LIBRARY_PATH)
find_program(exe NAMES mpt_consumer PATHS ${build} ${build}/${CONFIG} NO_DEFAULT_PATH)
if(NOT exe)
  message(FATAL_ERROR "package consumer: no mpt_consumer executable under ${build}")
endif()
execute_process(COMMAND ${exe} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out TIMEOUT 120)
if(NOT rc EQUAL 0 OR NOT out MATCHES "mpt consumer OK")
  find_program(ldd ldd)
  if(ldd)
    execute_process(COMMAND ${ldd} ${exe} OUTPUT_VARIABLE libs ERROR_VARIABLE libs)
    set(out "${out}\nldd ${exe}:\n${libs}")
  endif()
  message(FATAL_ERROR "package consumer: run failed (${rc})\n$ ${exe}\n${out}")
endif()
message(STATUS "package consumer: run OK\n${out}")
