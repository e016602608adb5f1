/* XXH3. Where libxxhash has its runtime-dispatched entry points (x86), they
 * replace the plain ones: AVX2 when the CPU has it, twice the default SSE2
 * path on cached data, which is what a transfer's checksum reads. The
 * hashes are the same either way. */
#ifndef HPD_COMMON_HASH_H
#define HPD_COMMON_HASH_H

#include <xxhash.h>
#ifdef HPD_HAVE_XXH_DISPATCH
#include <xxh_x86dispatch.h>
#endif

#endif
