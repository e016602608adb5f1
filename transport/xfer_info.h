/* What a node publishes for the data plane and how a peer's is checked,
 * without UCX (the coordinator's part of the data plane). */
#ifndef HPD_TRANSPORT_XFER_INFO_H
#define HPD_TRANSPORT_XFER_INFO_H

#include <msgpack.h>
#include <stddef.h>

#include "common/status.h"

#define HPD_XFER_MAX_REGIONS 16

/* Checks a peer's packed info without UCX: its shape, a worker address
 * UCX can read (a length from 3 bytes to 64 KiB whose header names an
 * address version UCX reads: UCX reads an address without its length and
 * aborts the process on an unknown version), and regions that fit the
 * address space with rkeys of 1 byte to 64 KiB. HPD_ERR_FORMAT with why
 * (may be NULL) saying what is wrong. The coordinator checks a node's info
 * at registration, so that a bad one never reaches another node. */
hpd_status_t hpd_xfer_check_info(const msgpack_object *info, char *why, size_t why_len);

#endif
