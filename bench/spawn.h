/* The benchmarks' local clusters: a process started with its output in a log
 * file, killed with the benchmark (PR_SET_PDEATHSIG), OpenMP threads that
 * sleep when idle (the nodes share the cores); the port a daemon wrote to
 * its port file; a client once the coordinator answers. */
#ifndef HPD_BENCH_SPAWN_H
#define HPD_BENCH_SPAWN_H

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "client/client.h"
#include "common/util.h"

static inline pid_t hpd_bench_spawn(char *const argv[], const char *log)
{
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        setenv("OMP_WAIT_POLICY", "passive", 1);
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

/* The port in file once it is written (10 s at most; 0: none). */
static inline uint16_t hpd_bench_read_port(const char *file)
{
    for (int i = 0; i < 400; i++) {
        char *text;
        size_t len;
        usleep(25000);
        if (access(file, R_OK) == 0 && hpd_read_file(file, &text, &len) == HPD_OK) {
            const uint16_t port = (uint16_t)atoi(text);
            free(text);
            if (port != 0)
                return port;
        }
    }
    return 0;
}

/* A client of the coordinator on 127.0.0.1:port, once it answers (10 s at
 * most; NULL: it did not). */
static inline hpd_client_t *hpd_bench_client(uint16_t port)
{
    hpd_client_params_t cp = {.host = "127.0.0.1", .port = port, .timeout_ms = 600000};
    hpd_client_t *client = NULL;
    for (int i = 0; i < 200 && client == NULL; i++) {
        usleep(50000);
        hpd_client_create(&cp, &client);
    }
    return client;
}

#endif
