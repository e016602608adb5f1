# Rewrites a .cu file's kernel launches for the host stand-in
# (kernels/cuda/cuda_ops.h beside this file):
#   cmake -DIN=kernels/cuda/gemm.cu -DOUT=gemm_host.cpp -P launch.cmake
# kernel<<<grid, block, 0, s>>>(args) becomes
# hpd_emu_launcher(grid, block, [](auto... as) { kernel(as...); })(args).
file(READ ${IN} src)
string(REGEX REPLACE
  "([A-Za-z_][A-Za-z_0-9]*(<[^<>;]*>)?)<<<([^,;]*), ([^,;]*), 0, s>>>\\("
  "hpd_emu_launcher(dim3(\\3), dim3(\\4), [](auto... as) { \\1(as...); })("
  out "${src}")
if(out MATCHES "<<<")
  message(FATAL_ERROR "launch.cmake: a launch in ${IN} was not rewritten")
endif()
file(WRITE ${OUT} "${out}")
