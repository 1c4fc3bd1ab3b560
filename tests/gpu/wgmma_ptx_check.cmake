# wgmma_ptx_check.cmake — CTest `wgmma_ptx_check` (label unit; CUDA builds, needs nvcc only): the sm_90a PTX of
# src/cuda/kernels_wgmma.cu, checked for the property the default (PREP) wgmma rows' speed rests on: every PREP
# kernel hands registers from its producer to its consumers (setmaxnreg) and contains no trap — a trap anywhere in a
# kernel keeps ptxas from giving the consumers the registers setmaxnreg hands them, and they then spill and serialise
# the wgmmas (docs/kernels.md §9.6, docs/PERF.md twenty-first session). Usage:
#   cmake -DNVCC=path -DSOURCE_DIR=repo -DOUT=file.ptx -P wgmma_ptx_check.cmake
execute_process(
  COMMAND ${NVCC} -std=c++17 -I${SOURCE_DIR}/src -I${SOURCE_DIR}/src/cuda -I${SOURCE_DIR}/include
          -gencode arch=compute_90a,code=compute_90a -ptx ${SOURCE_DIR}/src/cuda/kernels_wgmma.cu -o ${OUT}
  RESULT_VARIABLE status ERROR_VARIABLE errors)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "wgmma_ptx_check: nvcc -ptx failed (${status}): ${errors}")
endif()
file(STRINGS ${OUT} lines REGEX "\\.entry|trap;|setmaxnreg")
set(prep_count 0)
set(virt_counts 0 0 0) # PREP kernels of VIRT 0 (default), 1 (registers), 2 (slots): each kind must be found
set(bad "")
set(entry "")
macro(finish_entry)
  if(entry MATCHES "wgmma_tile_kernelI.*ELb[01]ELb1ELi([0-9]+)EE") # <…, SPLIT, PREP = true, VIRT>
    set(virt ${CMAKE_MATCH_1})
    if(virt LESS 3)
      list(GET virt_counts ${virt} n)
      math(EXPR n "${n} + 1")
      list(REMOVE_AT virt_counts ${virt})
      list(INSERT virt_counts ${virt} ${n})
    endif()
    math(EXPR prep_count "${prep_count} + 1")
    if(has_trap OR NOT has_setmaxnreg)
      list(APPEND bad "${entry} (trap: ${has_trap}, setmaxnreg: ${has_setmaxnreg})")
    endif()
  endif()
endmacro()
foreach(line IN LISTS lines)
  if(line MATCHES "\\.entry[ \t]+([A-Za-z0-9_$]+)")
    set(next ${CMAKE_MATCH_1}) # (finish_entry's own MATCHES resets CMAKE_MATCH_1)
    finish_entry()
    set(entry ${next})
    set(has_trap 0)
    set(has_setmaxnreg 0)
  elseif(line MATCHES "trap;")
    set(has_trap 1)
  elseif(line MATCHES "setmaxnreg")
    set(has_setmaxnreg 1)
  endif()
endforeach()
finish_entry()
if(prep_count EQUAL 0)
  message(FATAL_ERROR "wgmma_ptx_check: no PREP wgmma_tile_kernel entry in ${OUT} (the kernel's name or template changed?)")
endif()
# every kind of PREP kernel matched, so a change of name or template cannot shrink what is checked unseen (it did once:
# from 7889d07 to 11a74d8 only 12 of 60 matched)
foreach(virt 0 1 2)
  list(GET virt_counts ${virt} n)
  if(n EQUAL 0)
    message(FATAL_ERROR "wgmma_ptx_check: no PREP wgmma_tile_kernel with VIRT = ${virt} in ${OUT} (the kernel's name or template changed?)")
  endif()
endforeach()
if(bad)
  list(LENGTH bad bad_count)
  string(REPLACE ";" "\n  " listed "${bad}")
  message(FATAL_ERROR "wgmma_ptx_check: ${bad_count} of ${prep_count} PREP wgmma kernels have a trap or no setmaxnreg:\n  ${listed}")
endif()
message(STATUS "wgmma_ptx_check: ${prep_count} PREP wgmma kernels (VIRT 0/1/2: ${virt_counts}), each with setmaxnreg and no trap")
