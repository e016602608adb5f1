/* Where a prefill node may write for a decode node's reservation: its
 * prompt pages (any group, whole or part of one page) and its slot, and
 * nothing else -- a page of another request, a span across two pages, past
 * the slot, another region; at tensor parallelism the same in every
 * rank's regions and in no others. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "decode_node/writes.h"

enum { PAGE = 4096, SLOT = 1000 };

static const uint32_t g0[] = {7, 3, 12}, g1[] = {20, 21, 5};
static const uint32_t *const tables[] = {g0, g1};
static const uint32_t kv0[] = {0}, slot0[] = {1};
static const hpd_reservation_span_t span = {.kv_regions = kv0, .slot_regions = slot0, .n_ranks = 1,
                                            .page_bytes = PAGE, .tables = tables,
                                            .n_groups = 2, .n_pages = 3,
                                            .slot_offset = 3 * SLOT, .slot_bytes = SLOT};

static bool allows(uint32_t region, uint64_t offset, uint64_t bytes)
{
    const hpd_xfer_dest_t d = {.region = region, .offset = offset, .bytes = bytes};
    char why[200] = "";
    const bool ok = hpd_reservation_allows(&span, &d, 1, why, sizeof(why));
    assert_true(ok || strstr(why, "is outside the reservation") != NULL);
    return ok;
}

static void test_pages(void **state)
{
    assert_true(allows(0, 7 * PAGE, PAGE));
    assert_true(allows(0, 5 * PAGE, PAGE)); /* group 1 */
    assert_true(allows(0, 12 * PAGE + 100, 200)); /* part of a page */
    assert_false(allows(0, 8 * PAGE, PAGE)); /* another request's page */
    assert_false(allows(0, 0, PAGE));
    assert_false(allows(0, 7 * PAGE + 1, PAGE)); /* into page 8 */
    assert_false(allows(0, 3 * PAGE, 2 * PAGE)); /* 3 and 4: 4 is not ours */
    assert_false(allows(0, 7 * PAGE, 0));
    assert_false(allows(0, UINT64_MAX - 10, 20)); /* wraps */
}

static void test_slot(void **state)
{
    assert_true(allows(1, 3 * SLOT, SLOT));
    assert_true(allows(1, 3 * SLOT + 10, SLOT - 10));
    assert_true(allows(1, 3 * SLOT + 5, 1)); /* one byte is a write too */
    assert_false(allows(1, 3 * SLOT + 5, 0)); /* an empty one names nothing */
    assert_false(allows(1, 3 * SLOT, SLOT + 1));
    assert_false(allows(1, 2 * SLOT, SLOT)); /* the slot before */
    assert_false(allows(1, 4 * SLOT, 1));    /* the slot after */
    assert_false(allows(1, 3 * SLOT - 1, 2));
    assert_false(allows(1, UINT64_MAX, 1));
    assert_false(allows(2, 3 * SLOT, 1)); /* another region */
}

static void test_lists(void **state)
{
    const hpd_xfer_dest_t ok[] = {{.offset = 7 * PAGE, .bytes = PAGE},
                                  {.offset = 20 * PAGE, .bytes = PAGE},
                                  {.region = 1, .offset = 3 * SLOT, .bytes = SLOT}};
    const hpd_xfer_dest_t bad[] = {{.offset = 7 * PAGE, .bytes = PAGE},
                                   {.offset = 9 * PAGE, .bytes = PAGE}};
    char why[200];
    assert_true(hpd_reservation_allows(&span, ok, 3, why, sizeof(why)));
    assert_true(hpd_reservation_allows(&span, ok, 0, NULL, 0)); /* nothing written */
    assert_false(hpd_reservation_allows(&span, bad, 2, why, sizeof(why)));
    assert_string_equal(why, "destination 1 (4096 bytes at offset 36864 of region 0) is "
                             "outside the reservation");
}

/* two ranks: pages in regions 0 and 2, slots in 1 and 3 */
static void test_ranks(void **state)
{
    static const uint32_t kv[] = {0, 2}, slot[] = {1, 3};
    hpd_reservation_span_t two = span;
    two.kv_regions = kv, two.slot_regions = slot, two.n_ranks = 2;
    const hpd_xfer_dest_t ok[] = {{.region = 2, .offset = 7 * PAGE, .bytes = PAGE},
                                  {.region = 0, .offset = 5 * PAGE, .bytes = PAGE},
                                  {.region = 3, .offset = 3 * SLOT, .bytes = SLOT}};
    char why[200];
    assert_true(hpd_reservation_allows(&two, ok, 3, why, sizeof(why)));
    const hpd_xfer_dest_t other[][1] = {{{.region = 2, .offset = 8 * PAGE, .bytes = PAGE}},
                                        {{.region = 3, .offset = 4 * SLOT, .bytes = 1}},
                                        {{.region = 4, .offset = 7 * PAGE, .bytes = PAGE}},
                                        {{.region = 3, .offset = 7 * PAGE, .bytes = PAGE}}};
    for (size_t i = 0; i < sizeof(other) / sizeof(other[0]); i++)
        assert_false(hpd_reservation_allows(&two, other[i], 1, why, sizeof(why)));
    assert_false(allows(2, 7 * PAGE, PAGE)); /* one rank: region 2 is not its */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pages),
        cmocka_unit_test(test_slot),
        cmocka_unit_test(test_lists),
        cmocka_unit_test(test_ranks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
