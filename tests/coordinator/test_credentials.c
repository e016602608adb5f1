/* The coordinator's credentials: the node secret and client keys, their
 * roles, the file's mistakes, and what a reload revokes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "common/util.h"
#include "coordinator/credentials.h"
#include "tests/test_helpers.h"

static char dir[256], secret_file[300], keys_file[300];

#define SECRET "node-secret-0123456789"
#define KEY_A "client-key-aaaaaaaaaaaa"
#define KEY_B "client-key-bbbbbbbbbbbb"

static void write_text(const char *path, const char *text)
{
    assert_int_equal(hpd_write_file(path, text, strlen(text)), HPD_OK);
}

static int setup(void **state)
{
    test_tmpdir(dir, sizeof(dir), "credentials");
    snprintf(secret_file, sizeof(secret_file), "%s/secret", dir);
    snprintf(keys_file, sizeof(keys_file), "%s/keys", dir);
    write_text(secret_file, SECRET "\n");
    return 0;
}

static int teardown(void **state)
{
    test_rmtree(dir);
    return 0;
}

static uint32_t check(const hpd_credentials_t *c, const char *token, char *who, uint64_t *id)
{
    char w[64] = "";
    uint64_t i = 0;
    const uint32_t roles = hpd_credentials_check(c, token, strlen(token), w, sizeof(w), &i);
    if (who != NULL)
        strcpy(who, w);
    if (id != NULL)
        *id = i;
    return roles;
}

/* Without a keys file the token is a node only (never a client); with one, the
 * secret is a node only and each key a client only, named by its tenant. */
static void test_roles(void **state)
{
    hpd_credentials_t *c;
    char err[300], who[64];
    uint64_t id_secret, id_a, id_b;

    assert_int_equal(hpd_credentials_load(secret_file, NULL, &c, err, sizeof(err)), HPD_OK);
    /* without a keys file the secret is still a node only */
    assert_int_equal(check(c, SECRET, who, &id_secret), HPD_ROLE_NODE);
    assert_string_equal(who, "node");
    assert_int_equal(check(c, KEY_A, NULL, NULL), 0);
    assert_int_equal(check(c, SECRET "x", NULL, NULL), 0); /* longer */
    assert_int_equal(check(c, "node-secret", NULL, NULL), 0); /* a prefix */
    assert_int_equal(check(c, "", NULL, NULL), 0);
    assert_int_equal(hpd_credentials_n_keys(c), 0);
    assert_false(hpd_credentials_grants(c, id_secret, HPD_ROLE_CLIENT));
    assert_true(hpd_credentials_grants(c, id_secret, HPD_ROLE_NODE));
    hpd_credentials_destroy(c);

    write_text(keys_file, "# keys\n" KEY_A " tenant-a\n\n  " KEY_B "  \n");
    assert_int_equal(hpd_credentials_load(secret_file, keys_file, &c, err, sizeof(err)), HPD_OK);
    assert_int_equal(hpd_credentials_n_keys(c), 2);
    assert_int_equal(check(c, SECRET, who, &id_secret), HPD_ROLE_NODE);
    assert_string_equal(who, "node");
    assert_int_equal(check(c, KEY_A, who, &id_a), HPD_ROLE_CLIENT);
    assert_string_equal(who, "tenant tenant-a");
    assert_int_equal(check(c, KEY_B, who, &id_b), HPD_ROLE_CLIENT);
    assert_string_equal(who, "client key 2");
    assert_true(id_a != id_b && id_a != id_secret);
    assert_true(hpd_credentials_grants(c, id_a, HPD_ROLE_CLIENT));
    assert_false(hpd_credentials_grants(c, id_a, HPD_ROLE_NODE));
    assert_false(hpd_credentials_grants(c, id_secret, HPD_ROLE_CLIENT));
    assert_true(hpd_credentials_grants(c, id_secret, HPD_ROLE_NODE));
    hpd_credentials_destroy(c);

    /* a reload without key B: B grants nothing, A still does */
    write_text(keys_file, KEY_A " tenant-a\n");
    assert_int_equal(hpd_credentials_load(secret_file, keys_file, &c, err, sizeof(err)), HPD_OK);
    assert_false(hpd_credentials_grants(c, id_b, HPD_ROLE_CLIENT));
    assert_true(hpd_credentials_grants(c, id_a, HPD_ROLE_CLIENT));
    assert_int_equal(check(c, KEY_B, NULL, NULL), 0);
    hpd_credentials_destroy(c);
}

/* 256 characters: the longest key there may be */
#define LONG_KEY                                                                             \
    "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"                     \
    "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"                     \
    "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"                     \
    "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

/* Keys of 16 and 256 characters load. */
static void test_key_lengths(void **state)
{
    char err[300];
    hpd_credentials_t *c = NULL;
    write_text(keys_file, LONG_KEY "\n0123456789abcdef\n");
    if (hpd_credentials_load(secret_file, keys_file, &c, err, sizeof(err)) != HPD_OK)
        fail_msg("%s", err);
    assert_int_equal(hpd_credentials_n_keys(c), 2);
    hpd_credentials_destroy(c);
}

/* Each mistake in a keys file is refused with its line and what is
 * expected. */
static void test_bad_files(void **state)
{
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"short\n", "keys:1: a key of 5 characters (expected 16 to 256)"},
        {LONG_KEY "x\n", "keys:1: a key of 257 characters (expected 16 to 256)"},
        {"# only a comment\n\n", "no client key (one per line: KEY [TENANT])"},
        {KEY_A "\n" KEY_B "\n" KEY_A " again\n", "keys:3: the key of line 1 again"},
        {KEY_A " two words\n", "keys:1: tenant 'two words' (expected one word"},
        {SECRET "\n", "a client key equals the node secret"},
    };
    char err[300];
    hpd_credentials_t *c = NULL;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        write_text(keys_file, cases[i].text);
        err[0] = '\0';
        assert_int_equal(hpd_credentials_load(secret_file, keys_file, &c, err, sizeof(err)),
                         HPD_ERR_INVALID_ARG);
        if (strstr(err, cases[i].want) == NULL)
            fail_msg("case %zu: '%s' does not say '%s'", i, err, cases[i].want);
    }
    char missing[320];
    snprintf(missing, sizeof(missing), "%s/nosuch", dir);
    assert_int_not_equal(hpd_credentials_load(secret_file, missing, &c, err, sizeof(err)),
                         HPD_OK);
    assert_non_null(strstr(err, "cannot read the client keys file"));
    assert_int_not_equal(hpd_credentials_load(missing, NULL, &c, err, sizeof(err)), HPD_OK);
    assert_non_null(strstr(err, "cannot read the token file"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roles),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_key_lengths),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
