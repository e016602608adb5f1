/* Runs the fuzz target over every file of a corpus directory, so that normal
 * builds (no libFuzzer) keep the corpus as a regression test. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int main(int argc, char **argv)
{
    int n = 0;
    for (int a = 1; a < argc; a++) {
        DIR *d = opendir(argv[a]);
        struct dirent *e;
        if (d == NULL) {
            fprintf(stderr, "cannot open %s\n", argv[a]);
            return 1;
        }
        while ((e = readdir(d)) != NULL) {
            char path[4096], *data;
            size_t len;
            if (e->d_name[0] == '.')
                continue;
            snprintf(path, sizeof(path), "%s/%s", argv[a], e->d_name);
            if (hpd_read_file(path, &data, &len) != HPD_OK)
                return 1;
            LLVMFuzzerTestOneInput((const uint8_t *)data, len);
            free(data);
            n++;
        }
        closedir(d);
    }
    printf("%d passed, 0 failed\n", n);
    return n > 0 ? 0 : 1;
}
