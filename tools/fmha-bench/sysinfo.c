/* sysinfo.c: the "device" block of an fmha-bench record (CPU model, ISA in
 * use, threads, compiler, library version and git commit) and the memory and
 * executable-path look-ups the child processes need. */
#include "bench.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

/* The value of the first "key<spaces>: value" line of a /proc file. */
static int proc_field(const char *path, const char *key, char *value, size_t value_size)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char line[1024];
    size_t key_length = strlen(key);
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        if (strncmp(line, key, key_length) != 0)
            continue;
        char *p = line + key_length;
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p != ':')
            continue;
        p++;
        while (*p == ' ' || *p == '\t')
            p++;
        size_t n = strcspn(p, "\n");
        if (n >= value_size)
            n = value_size - 1;
        memcpy(value, p, n);
        value[n] = '\0';
        found = 1;
    }
    fclose(f);
    return found;
}

double bench_mem_available_bytes(void)
{
    char value[128];
    if (!proc_field("/proc/meminfo", "MemAvailable", value, sizeof value))
        return 0;
    return strtod(value, NULL) * 1024.0; /* kB */
}

const char *bench_self_exe(void)
{
    static char path[PATH_MAX];
    if (path[0])
        return path;
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
    if (n <= 0) {
        path[0] = '\0';
        return NULL;
    }
    path[n] = '\0';
    return path;
}

/* `git -C <dir of this executable> rev-parse HEAD`, or "unknown". */
static void git_commit(char *out, size_t out_size)
{
    snprintf(out, out_size, "unknown");
#ifdef FMHA_GIT_COMMIT
    snprintf(out, out_size, "%s", FMHA_GIT_COMMIT);
    return;
#else
    const char *exe = bench_self_exe();
    if (!exe)
        return;
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", exe);
    char *parent = dirname(dir);
    int fds[2];
    if (pipe(fds) != 0)
        return;
    pid_t pid = fork();
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        dup2(fds[1], STDOUT_FILENO);
        if (devnull >= 0)
            dup2(devnull, STDERR_FILENO);
        close(fds[0]);
        close(fds[1]);
        execlp("git", "git", "-C", parent, "rev-parse", "HEAD", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    char buf[128];
    size_t length = 0;
    if (pid > 0) {
        ssize_t got;
        while (length < sizeof buf - 1 &&
               ((got = read(fds[0], buf + length, sizeof buf - 1 - length)) > 0 || (got < 0 && errno == EINTR)))
            if (got > 0)
                length += (size_t)got;
    }
    close(fds[0]);
    buf[length] = '\0';
    int status = 0;
    if (pid > 0)
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
    size_t hex = strspn(buf, "0123456789abcdef");
    if (pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 && hex >= 7) {
        buf[hex] = '\0';
        snprintf(out, out_size, "%s", buf);
    }
#endif
}

static const char *compiler_name(void)
{
#if defined(__clang__)
    return "clang " __VERSION__;
#elif defined(__GNUC__)
    return "gcc " __VERSION__;
#elif defined(__VERSION__)
    return __VERSION__;
#else
    return "unknown";
#endif
}

json_value *bench_device_info(void)
{
    json_value *device = json_new_object();
    char value[512];
    json_set_string(device, "backend", "cpu");
    json_set_string(device, "device_kind", "cpu");
    if (proc_field("/proc/cpuinfo", "model name", value, sizeof value) ||
        proc_field("/proc/cpuinfo", "Model", value, sizeof value) ||
        proc_field("/proc/cpuinfo", "Hardware", value, sizeof value))
        json_set_string(device, "cpu", value);
    else
        json_set_string(device, "cpu", "unknown");
    json_set_number(device, "logical_cpus", (double)sysconf(_SC_NPROCESSORS_ONLN));
    json_set_string(device, "isa", fmha_isa_name());
    json_set_number(device, "threads", (double)fmha_get_num_threads());
    if (proc_field("/proc/meminfo", "MemTotal", value, sizeof value))
        json_set_number(device, "mem_total_mb", strtod(value, NULL) / 1024.0);
    struct utsname un;
    if (uname(&un) == 0) {
        snprintf(value, sizeof value, "%s %s %s", un.sysname, un.release, un.machine);
        json_set_string(device, "os", value);
    }
    json_set_string(device, "compiler", compiler_name());
    json_set_string(device, "fmha_version", fmha_version_string());
    git_commit(value, sizeof value);
    json_set_string(device, "git_commit", value);
    double f32, bf16;
    bench_peak_gflops(fmha_get_num_threads(), &f32, &bf16);
    if (f32 > 0) json_set_number(device, "peak_gflops", f32);
    if (bf16 > 0) json_set_number(device, "peak_gflops_bf16", bf16);
    return device;
}
