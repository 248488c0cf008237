# Installs the build into a fresh prefix, then builds every example of examples/ (consumer,
# allreduce, memory_channel, port_channel) against it three ways, and runs every build:
#   cmake       examples/CMakeLists.txt with find_package(maco) (consumer also with libmaco.a);
#   pc-shared   examples/Makefile: pkg-config, libmaco.so, with the rpath the Makefile adds;
#               plus consumer.c linked with the bare `pkg-config --cflags --libs maco` and run
#               with LD_LIBRARY_PATH=$(pkg-config --variable=libdir maco), as README says;
#   pc-static   examples/Makefile STATIC=1: `pkg-config --static`, libmaco.a (checked: the
#               programs do not need libmaco.so).
# (README.md's and examples/README.md's commands, as printed: the docs_commands test.)
# consumer runs alone and must print "rank 0 of 1"; the others run under the installed
# maco-run with 2 ranks, and every rank must print its success line, or every rank a line
# starting with "SKIP:" and maco-run exit with 77 (no usable GPU, as on CI machines). Programs built with an rpath run without
# LD_LIBRARY_PATH. Any step that fails fails the test with a message naming the step.
# Needs pkg-config, make and nvcc.
# Arguments: -DBUILD=<build dir> -DSRC=<source dir> -DWORK=<scratch dir>
#            [-DCUDA_COMPILER=<nvcc>] (the compiler of the build; default: nvcc on PATH)

# Runs COMMAND...; on failure (exit status not 0, or a timeout) stops the test naming `name`,
# with the command's output. The output (stdout and stderr) is left in step_output.
function(step name)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out
    TIMEOUT 600)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "install_and_consume: step '${name}' failed (${rc}):\n  ${cmd}\n${out}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

# Fails naming `name` unless `text` matches `regex`.
function(expect name text regex)
  if(NOT text MATCHES "${regex}")
    string(REPLACE "\n" "\\n" shown "${regex}")
    message(FATAL_ERROR "install_and_consume: step '${name}': output does not match "
                        "'${shown}':\n${text}")
  endif()
endfunction()

# The tools: pkg-config and make for the pkg-config builds, nvcc for the CUDA examples.
find_program(PKG_CONFIG pkg-config)
find_program(MAKE_PROGRAM NAMES make gmake)
foreach(tool PKG_CONFIG MAKE_PROGRAM)
  if(NOT ${tool})
    message(FATAL_ERROR "install_and_consume: ${tool} not found: install pkg-config and make "
                        "(e.g. apt-get install pkg-config make)")
  endif()
endforeach()
if(CUDA_COMPILER)
  set(nvcc ${CUDA_COMPILER})
else()
  find_program(nvcc nvcc)
  if(NOT nvcc)
    message(FATAL_ERROR "install_and_consume: nvcc not found: pass -DCUDA_COMPILER or put it on PATH")
  endif()
endif()

file(REMOVE_RECURSE ${WORK})
set(prefix ${WORK}/prefix)
step("cmake --install" ${CMAKE_COMMAND} --install ${BUILD} --prefix ${prefix})
foreach(f include/maco/maco.h include/maco/device/memory_channel.h lib/libmaco.so.0
          lib/cmake/maco/macoConfig.cmake lib/pkgconfig/maco.pc lib/pkgconfig/maco-cuda.pc
          bin/maco-run bin/maco-perf bin/maco-info bin/maco-plan)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "install_and_consume: step 'install tree': it lacks ${f}")
  endif()
endforeach()
# The NCCL-compatible library, where it was built: lib/libmaco_nccl.so and the folder README.md
# names for LD_LIBRARY_PATH, lib/maco-nccl/libnccl.so.2 (a link to it).
if(EXISTS ${prefix}/lib/libmaco_nccl.so AND NOT EXISTS ${prefix}/lib/maco-nccl/libnccl.so.2)
  message(FATAL_ERROR "install_and_consume: step 'install tree': lib/libmaco_nccl.so without "
                      "lib/maco-nccl/libnccl.so.2")
endif()
set(maco_run ${prefix}/bin/maco-run)
# libmaco.a is installed unless the build was configured with MACO_BUILD_STATIC=OFF.
if(EXISTS ${prefix}/lib/libmaco.a)
  set(static_builds cmake/consumer/consumer_static pc-static/consumer pc-static/allreduce
                    pc-static/memory_channel pc-static/port_channel)
  set(static_dirs pc-static)
else()
  message(STATUS "install_and_consume: no libmaco.a (MACO_BUILD_STATIC=OFF): static builds skipped")
  set(static_builds)
  set(static_dirs)
endif()
# Programs built with an rpath must not need LD_LIBRARY_PATH: run them without it.
set(no_ld_path ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH)

# ---- CMake: find_package(maco)
# The examples must compile without warnings: README quotes them.
step("cmake configure examples" ${CMAKE_COMMAND} -S ${SRC}/examples -B ${WORK}/cmake
  -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER=${nvcc}
  -DCMAKE_C_FLAGS=-Werror -DCMAKE_CUDA_FLAGS=-Xcompiler=-Werror)
step("cmake build examples" ${CMAKE_COMMAND} --build ${WORK}/cmake)
message(STATUS "cmake build examples:\n${step_output}")

# ---- pkg-config: examples/Makefile, shared and static
execute_process(COMMAND ${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${prefix}/lib/pkgconfig
  ${PKG_CONFIG} --variable=libdir maco OUTPUT_VARIABLE pc_libdir
  OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT IS_DIRECTORY "${pc_libdir}")
  message(FATAL_ERROR "install_and_consume: step 'pkg-config --variable=libdir maco' failed "
                      "(${rc}): '${pc_libdir}'")
endif()
set(pc_env ${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${prefix}/lib/pkgconfig)
set(werror "CFLAGS=-O2 -Wall -Wextra -Werror" "NVCCFLAGS=-O2 -Xcompiler=-Wall,-Wextra,-Werror")
step("make (pkg-config, libmaco.so)" ${pc_env} ${MAKE_PROGRAM} -C ${SRC}/examples
  OUT=${WORK}/pc-shared NVCC=${nvcc} ${werror})
message(STATUS "make (pkg-config, libmaco.so):\n${step_output}")
if(static_dirs)
  step("make STATIC=1 (pkg-config --static, libmaco.a)" ${pc_env} ${MAKE_PROGRAM}
    -C ${SRC}/examples OUT=${WORK}/pc-static STATIC=1 NVCC=${nvcc} ${werror})
  message(STATUS "make STATIC=1 (pkg-config --static, libmaco.a):\n${step_output}")
endif()
# The bare flags, no rpath: what README tells to run with LD_LIBRARY_PATH.
step("pkg-config --cflags --libs maco" ${pc_env} ${PKG_CONFIG} --cflags --libs maco)
string(STRIP "${step_output}" flags)
separate_arguments(flags UNIX_COMMAND "${flags}")
file(MAKE_DIRECTORY ${WORK}/pc-plain)
step("cc consumer.c with pkg-config's flags" cc ${SRC}/examples/consumer/consumer.c ${flags}
  -o ${WORK}/pc-plain/consumer)

# What each program links: libmaco.so.0 for the shared builds, never for the static ones.
foreach(exe cmake/consumer/consumer cmake/allreduce cmake/memory_channel cmake/port_channel
            pc-shared/consumer pc-shared/allreduce pc-shared/memory_channel pc-shared/port_channel
            ${static_builds})
  step("readelf -d ${exe}" readelf -d --wide ${WORK}/${exe})
  if(exe MATCHES "static")
    if(step_output MATCHES "libmaco\\.so")
      message(FATAL_ERROR "install_and_consume: step 'static link': ${exe} needs libmaco.so; "
                          "it must link libmaco.a:\n${step_output}")
    endif()
  elseif(NOT step_output MATCHES "NEEDED[^\n]*libmaco\\.so\\.0")
    message(FATAL_ERROR "install_and_consume: step 'shared link': ${exe} does not need "
                        "libmaco.so.0:\n${step_output}")
  endif()
endforeach()

# ---- Run every build.
set(consumers cmake/consumer/consumer pc-shared/consumer ${static_builds})
list(FILTER consumers INCLUDE REGEX "consumer")
foreach(exe ${consumers})
  step("run ${exe}" ${no_ld_path} ${WORK}/${exe})
  expect("run ${exe}" "${step_output}" "rank 0 of 1")
  string(STRIP "${step_output}" out)
  message(STATUS "${exe}: ${out}")
endforeach()
step("run pc-plain/consumer with LD_LIBRARY_PATH=${pc_libdir}" ${CMAKE_COMMAND} -E env
  LD_LIBRARY_PATH=${pc_libdir} ${WORK}/pc-plain/consumer)
expect("run pc-plain/consumer" "${step_output}" "rank 0 of 1")
string(STRIP "${step_output}" out)
message(STATUS "pc-plain/consumer, LD_LIBRARY_PATH=${pc_libdir}: ${out}")

foreach(build cmake pc-shared ${static_dirs})
  foreach(name allreduce memory_channel port_channel)
    set(exe ${build}/${name})
    # 0 and every rank's success line, or 77 (skipped) and a SKIP line (maco-run stops the
    # other ranks when the first skips, so only that one is sure to have printed).
    execute_process(COMMAND ${no_ld_path} ${maco_run} -n 2 --timeout 180 ${WORK}/${exe}
      RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out TIMEOUT 600)
    if(rc EQUAL 77)
      expect("maco-run -n 2 ${exe} (skipped)" "${out}" "\\[[01]\\] SKIP: ")
    elseif(rc EQUAL 0)
      foreach(rank 0 1)
        expect("maco-run -n 2 ${exe}, rank ${rank}" "${out}"
               "\\[${rank}\\] ${name}: rank ${rank} of 2: [^\n]* correct")
      endforeach()
    else()
      message(FATAL_ERROR "install_and_consume: step 'maco-run -n 2 ${exe}' failed (${rc}):\n${out}")
    endif()
    string(STRIP "${out}" out)
    message(STATUS "${exe}:\n${out}")
  endforeach()
endforeach()
message(STATUS "install_and_consume: every example built three ways and ran")
