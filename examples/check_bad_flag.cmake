# cmake -DPROGRAM=<example> -P check_bad_flag.cmake: `--epochs x` must exit with code 2 and a message.
execute_process(COMMAND ${PROGRAM} --epochs x RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc STREQUAL "2")
  message(FATAL_ERROR "${PROGRAM} --epochs x: exit code '${rc}', expected 2\n${out}${err}")
endif()
if(NOT err MATCHES "--epochs")
  message(FATAL_ERROR "${PROGRAM} --epochs x: no message naming --epochs on stderr:\n${err}")
endif()
message(STATUS "--epochs x: exit code 2: ${err}")
