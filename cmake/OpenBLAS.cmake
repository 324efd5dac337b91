# OpenBLAS from Debian. Prefer the OpenMP build (libopenblas-openmp-dev): called from inside
# one of our OpenMP parallel regions it runs single-threaded instead of spawning its own
# threads, so per-head GEMMs in attention do not oversubscribe the cores.
set(_arch_lib /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE})
set(_arch_inc /usr/include/${CMAKE_LIBRARY_ARCHITECTURE})
set(LLAMATRAIN_BLAS_NAME "")
foreach(_variant openblas-openmp openblas-pthread openblas-serial)
  if(EXISTS ${_arch_lib}/${_variant}/libopenblas.so AND EXISTS ${_arch_inc}/${_variant}/cblas.h)
    set(OPENBLAS_LIBRARY ${_arch_lib}/${_variant}/libopenblas.so)
    set(OPENBLAS_INCLUDE_DIR ${_arch_inc}/${_variant})
    set(LLAMATRAIN_BLAS_NAME "OpenBLAS (${_variant})")
    break()
  endif()
endforeach()
if(NOT OPENBLAS_LIBRARY)
  find_library(OPENBLAS_LIBRARY openblas)
  find_path(OPENBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas)
  set(LLAMATRAIN_BLAS_NAME "OpenBLAS")
endif()
if(NOT OPENBLAS_LIBRARY OR NOT OPENBLAS_INCLUDE_DIR)
  message(FATAL_ERROR "OpenBLAS not found: run scripts/install-deps.sh (libopenblas-openmp-dev)")
endif()
message(STATUS "llamatrain: BLAS ${LLAMATRAIN_BLAS_NAME}: ${OPENBLAS_LIBRARY}")
add_library(llamatrain::openblas INTERFACE IMPORTED)
set_target_properties(llamatrain::openblas PROPERTIES
  INTERFACE_LINK_LIBRARIES ${OPENBLAS_LIBRARY}
  INTERFACE_INCLUDE_DIRECTORIES ${OPENBLAS_INCLUDE_DIR})
