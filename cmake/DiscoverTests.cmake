# lt_discover_tests(TARGET [TEST_PREFIX P] [DISCOVERY_TIMEOUT S] [ENVIRONMENT "A=1;B=2"]
#                   [LABELS "l1;l2"] [PROPERTIES single-valued properties...])
#
# gtest_discover_tests with list-valued ENVIRONMENT and LABELS that work. CMake 3.25's
# GoogleTest module writes each element of PROPERTIES as its own argument, so a list value such
# as ENVIRONMENT "OMP_NUM_THREADS=2;LT_SIM_SCHEDULE=reverse" becomes ENVIRONMENT OMP_NUM_THREADS=2
# and a stray "property" LT_SIM_SCHEDULE=reverse: only the first variable was ever set. Here the
# discovered tests' names go to a TEST_LIST variable, and a CTest include file that runs after the
# discovery's own sets both properties on exactly those tests, lists intact.
include(GoogleTest)
function(lt_discover_tests target)
  cmake_parse_arguments(ARG "" "TEST_PREFIX;DISCOVERY_TIMEOUT" "ENVIRONMENT;LABELS;PROPERTIES" ${ARGN})
  # Named by target and prefix only, so that it stays the same from one configure to the next: the
  # list is written when the test binary is linked, which a reconfigure alone does not redo.
  string(MAKE_C_IDENTIFIER "lt_discovered_${target}_${ARG_TEST_PREFIX}" list_var)
  set(prefix_args)
  if(DEFINED ARG_TEST_PREFIX)
    set(prefix_args TEST_PREFIX ${ARG_TEST_PREFIX})
  endif()
  if(DEFINED ARG_DISCOVERY_TIMEOUT)
    list(APPEND prefix_args DISCOVERY_TIMEOUT ${ARG_DISCOVERY_TIMEOUT})
  endif()
  set(props_args)
  if(ARG_PROPERTIES)
    set(props_args PROPERTIES ${ARG_PROPERTIES})
  endif()
  gtest_discover_tests(${target} ${prefix_args} TEST_LIST ${list_var} ${props_args} ${ARG_UNPARSED_ARGUMENTS})
  set(script "${CMAKE_CURRENT_BINARY_DIR}/${list_var}_properties.cmake")
  set(sets "")
  if(ARG_ENVIRONMENT)
    string(APPEND sets " ENVIRONMENT [==[${ARG_ENVIRONMENT}]==]")
  endif()
  if(ARG_LABELS)
    string(APPEND sets " LABELS [==[${ARG_LABELS}]==]")
  endif()
  if(sets)
    file(WRITE "${script}"
         "if(DEFINED ${list_var} AND NOT \"\${${list_var}}\" STREQUAL \"\")\n"
         "  set_tests_properties(\${${list_var}} PROPERTIES${sets})\n"
         "endif()\n")
    set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${script}")
  endif()
endfunction()
