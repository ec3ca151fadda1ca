# SEQPAR_SANITIZE: a comma-separated list of sanitizers compiled into every seqpar target, test
# and benchmark: "address,undefined" (ASan + UBSan) or "thread" (TSan). Empty: none.
# UBSan findings abort (-fno-sanitize-recover=all), so a finding fails the test that hit it.
# scripts/sanitize.sh (make sanitize) builds and runs both configurations.
set(SEQPAR_SANITIZE "" CACHE STRING "Sanitizers for all targets: address,undefined | thread")

if(SEQPAR_SANITIZE)
  string(REPLACE "," ";" _seqpar_sanitizers "${SEQPAR_SANITIZE}")
  foreach(s ${_seqpar_sanitizers})
    if(NOT s MATCHES "^(address|undefined|thread|leak)$")
      message(FATAL_ERROR "SEQPAR_SANITIZE: unknown sanitizer '${s}'; valid: address, undefined, "
                          "thread, leak (comma-separated)")
    endif()
  endforeach()
  if("thread" IN_LIST _seqpar_sanitizers AND "address" IN_LIST _seqpar_sanitizers)
    message(FATAL_ERROR "SEQPAR_SANITIZE: thread and address cannot be combined")
  endif()
  set(_seqpar_sanitize_flags -fsanitize=${SEQPAR_SANITIZE} -fno-omit-frame-pointer -g)
  if("undefined" IN_LIST _seqpar_sanitizers)
    list(APPEND _seqpar_sanitize_flags -fno-sanitize-recover=all)
  endif()
  add_compile_options(${_seqpar_sanitize_flags})
  add_link_options(-fsanitize=${SEQPAR_SANITIZE})
  message(STATUS "seqpar: sanitizers ${SEQPAR_SANITIZE}")
endif()
