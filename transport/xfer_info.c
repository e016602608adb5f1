/* A peer's packed data-plane info, checked without UCX (transport/xfer.h,
 * hpd_xfer_check_info): the coordinator checks every node's at
 * registration and links no UCX for it. */
#include <stdarg.h>
#include <stdio.h>

#include "transport/rpc_codec.h"
#include "transport/xfer_info.h"

/* A packed UCX worker address starts with a header byte whose low 4 bits
 * are the address version: 0 (v1) or 1 (v2) in UCX 1.10 to 1.22 (the newest
 * checked, 2026-11: Debian 12's 1.13.1 and PyPI's libucx-cu13 1.22 both pass
 * test_xfer_local)
 * (src/ucp/wireup/address.c, ucp_address_unpack_header, which aborts on any
 * other). */
#define UCX_ADDRESS_VERSION_MASK 0x0f
#define UCX_ADDRESS_MAX_VERSION 1
#define INFO_MAX_BLOB (64u << 10)

static hpd_status_t info_fail(char *why, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static hpd_status_t info_fail(char *why, size_t len, const char *fmt, ...)
{
    va_list ap;
    if (why != NULL && len > 0) {
        va_start(ap, fmt);
        vsnprintf(why, len, fmt, ap);
        va_end(ap);
    }
    return HPD_ERR_FORMAT;
}

hpd_status_t hpd_xfer_check_info(const msgpack_object *info, char *why, size_t len)
{
    const msgpack_object *node = hpd_rpc_map_get(info, "node");
    const msgpack_object *addr = hpd_rpc_map_get(info, "address");
    const msgpack_object *regs = hpd_rpc_map_get(info, "regions");

    if (node == NULL || node->type != MSGPACK_OBJECT_POSITIVE_INTEGER || addr == NULL ||
        addr->type != MSGPACK_OBJECT_BIN || regs == NULL || regs->type != MSGPACK_OBJECT_ARRAY)
        return info_fail(why, len, "malformed (expected a map of node, address and regions)");
    if (regs->via.array.size > HPD_XFER_MAX_REGIONS)
        return info_fail(why, len, "%u regions (at most %d)", regs->via.array.size,
                         HPD_XFER_MAX_REGIONS);
    const uint32_t alen = addr->via.bin.size;
    if (alen < 3 || alen > INFO_MAX_BLOB)
        return info_fail(why, len, "a UCX worker address of %u bytes (expected 3 to %u)", alen,
                         INFO_MAX_BLOB);
    const unsigned version = (uint8_t)addr->via.bin.ptr[0] & UCX_ADDRESS_VERSION_MASK;
    if (version > UCX_ADDRESS_MAX_VERSION)
        return info_fail(why, len, "a UCX worker address of version %u, which UCX 1.10 to "
                         "1.22 cannot read (expected 0 to %d): a junk address, or a newer UCX",
                         version, UCX_ADDRESS_MAX_VERSION);
    for (uint32_t i = 0; i < regs->via.array.size; i++) {
        const msgpack_object *r = &regs->via.array.ptr[i];
        if (r->type != MSGPACK_OBJECT_ARRAY || r->via.array.size != 3 ||
            r->via.array.ptr[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
            r->via.array.ptr[1].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
            r->via.array.ptr[2].type != MSGPACK_OBJECT_BIN)
            return info_fail(why, len, "region %u is malformed (expected [base, length, rkey])",
                             i);
        const uint64_t base = r->via.array.ptr[0].via.u64, rlen = r->via.array.ptr[1].via.u64;
        if (rlen == 0 || base > UINT64_MAX - rlen)
            return info_fail(why, len, "region %u (%llu bytes at %#llx) is empty or runs past "
                             "the address space", i, (unsigned long long)rlen,
                             (unsigned long long)base);
        const uint32_t klen = r->via.array.ptr[2].via.bin.size;
        if (klen == 0 || klen > INFO_MAX_BLOB)
            return info_fail(why, len, "region %u's rkey has %u bytes (expected 1 to %u)", i,
                             klen, INFO_MAX_BLOB);
    }
    return HPD_OK;
}

