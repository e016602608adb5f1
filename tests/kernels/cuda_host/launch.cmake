# Rewrites a .cu file for the host stand-in (kernels/cuda/cuda_ops.h beside
# this file):
#   cmake -DIN=kernels/cuda/gemm.cu -DOUT=gemm_host.cpp -P launch.cmake
# kernel<<<grid, block, smem, stream>>>(args) (kernel may carry template
# arguments) becomes
#   hpd_emu_launcher(dim3(grid), dim3(block), smem, stream,
#                    [&](auto... as) { kernel(as...); })(args),
# and `extern __shared__ T name[];` (dynamic shared memory) becomes a pointer
# to the launch's buffer: `T *const name = (T *)hpd_emu_smem;`. The four
# launch arguments are written without commas inside them, as in every
# launch of kernels/cuda/; one that is not rewritten stops the build.
file(READ ${IN} src)
string(REGEX REPLACE
  "([A-Za-z_][A-Za-z_0-9]*(<[^<>;]*>)?)<<<([^,;]*), ([^,;]*), ([^,;]*), ([^;]*)>>>\\("
  "hpd_emu_launcher(dim3(\\3), dim3(\\4), (size_t)(\\5), \\6, [&](auto... as) { \\1(as...); })("
  out "${src}")
string(REGEX REPLACE
  "extern __shared__ ([A-Za-z_][A-Za-z_0-9]*) ([A-Za-z_][A-Za-z_0-9]*)\\[\\];"
  "\\1 *const \\2 = (\\1 *)hpd_emu_smem;"
  out "${out}")
if(out MATCHES "<<<")
  message(FATAL_ERROR "launch.cmake: a launch in ${IN} was not rewritten")
endif()
if(out MATCHES "extern __shared__")
  message(FATAL_ERROR "launch.cmake: a dynamic shared array in ${IN} was not rewritten")
endif()
file(WRITE ${OUT} "${out}")
