# A build folder first configured without CUDAARCHS reconfigures with CUDAARCHS=90 and then
# builds for exactly that architecture (regression: "CUDA_ARCHITECTURES is empty" for every
# CUDA target, because CMake reads CUDAARCHS only at a folder's first configure).
# Arguments: -DSRC=<source dir> -DWORK=<scratch dir>
file(REMOVE_RECURSE ${WORK})
foreach(step first second)
  if(step STREQUAL "first")
    set(env_args --unset=CUDAARCHS)
  else()
    set(env_args CUDAARCHS=90)
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -E env ${env_args}
    ${CMAKE_COMMAND} -S ${SRC} -B ${WORK} -G Ninja -DMACO_BUILD_TESTS=OFF -DMACO_BUILD_TOOLS=OFF
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the ${step} configure failed (${rc}):\n${out}\n${err}")
  endif()
endforeach()
file(STRINGS ${WORK}/CMakeCache.txt archs REGEX "^CMAKE_CUDA_ARCHITECTURES:")
if(NOT archs STREQUAL "CMAKE_CUDA_ARCHITECTURES:STRING=90")
  message(FATAL_ERROR "after CUDAARCHS=90 the cache holds '${archs}'")
endif()
message(STATUS "reconfigured with CUDAARCHS=90: ${archs}")
