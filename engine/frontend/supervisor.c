/* supervisor.c -- starting, reaping and restarting a stage process; see
 * supervisor.h.
 *
 * Why fork+exec and not fork alone: a stage initialises its backend (on a
 * GPU, a CUDA context), and such state does not survive fork. Exec'ing our
 * own binary through /proc/self/exe gives every stage a clean process that
 * runs the same build as the frontend, even if the file on disk has been
 * replaced since.
 *
 * Why the stage's stderr goes through a pipe to us instead of straight to
 * our stderr: when a stage dies before it is ready (a bad model path), the
 * reason is the last line it printed, and health should be able to say it.
 * We copy everything on, so logs look the same as without the pipe. */

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "supervisor.h"

#define ARGV_FIXED 11           // omni-engine stage KIND --ipc-fd 3 ...

int sup_init(StageProc *sp, const char *kind, SupResetFn *reset,
             int pool_fd, uint16_t owner, int argc, char **argv, Err *err)
{
    static char *fixed[ARGV_FIXED] = {
        "omni-engine", "stage", NULL, "--ipc-fd", "3", "--stats-fd", "4",
        "--pool-fd", "5", "--stage-owner", NULL
    };
    int nfixed = pool_fd >= 0 ? ARGV_FIXED : ARGV_FIXED - 4;

    memset(sp, 0, sizeof(*sp));
    sp->kind = kind;
    sp->reset = reset;
    sp->pool_fd = pool_fd;
    snprintf(sp->owner_arg, sizeof(sp->owner_arg), "%u", (unsigned) owner);
    sp->fd = sp->err_fd = -1;
    sp->backoff_ms = SUP_BACKOFF_MIN_MS;
    sp->stats = MAP_FAILED;
    sp->stats_fd = memfd_create("omni-stats", MFD_CLOEXEC);
    if (sp->stats_fd < 0) goto err;
    if (ftruncate(sp->stats_fd, sizeof(OmniStats)) != 0) goto err;
    sp->stats = mmap(NULL, sizeof(OmniStats), PROT_READ | PROT_WRITE,
                     MAP_SHARED, sp->stats_fd, 0);
    if (sp->stats == MAP_FAILED) goto err;
    sp->stats->magic = STATS_MAGIC;

    sp->argv = calloc((size_t) argc + ARGV_FIXED + 1, sizeof(char *));
    if (sp->argv == NULL) goto err;
    memcpy(sp->argv, fixed, (size_t) nfixed * sizeof(char *));
    sp->argv[2] = (char *) kind;
    if (pool_fd >= 0) sp->argv[ARGV_FIXED - 1] = sp->owner_arg;
    memcpy(sp->argv + nfixed, argv, (size_t) argc * sizeof(char *));
    return 0;

err:
    err_set(err, "stage statistics page: %s", strerror(errno));
    sup_free(sp);
    return -1;
}

void sup_free(StageProc *sp) {
    sup_close_channel(sp);
    if (sp->err_fd >= 0) close(sp->err_fd);
    if (sp->stats != MAP_FAILED) munmap(sp->stats, sizeof(OmniStats));
    if (sp->stats_fd >= 0) close(sp->stats_fd);
    free(sp->argv);
    sp->err_fd = sp->stats_fd = -1;
    sp->stats = MAP_FAILED;
    sp->argv = NULL;
}

/* In the child, between fork and exec: only async-signal-safe calls. The
 * channel, page and pool are first moved above the target numbers, so
 * that placing them on 3, 4 and 5 cannot overwrite one with another. */
static void child_exec(StageProc *sp, int chan, int errw) {
    sigset_t none;
    int      c, s, p = -1, last = STAGE_STATS_FD;

    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    for (int sig = 1; sig < NSIG; sig++) signal(sig, SIG_DFL);

    c = fcntl(chan, F_DUPFD, 10);
    s = fcntl(sp->stats_fd, F_DUPFD, 10);
    if (sp->pool_fd >= 0) p = fcntl(sp->pool_fd, F_DUPFD, 10);
    if (c < 0 || s < 0 || dup2(errw, 2) < 0
        || dup2(c, STAGE_IPC_FD) < 0 || dup2(s, STAGE_STATS_FD) < 0)
    {
        _exit(126);
    }
    if (sp->pool_fd >= 0) {
        if (p < 0 || dup2(p, STAGE_POOL_FD) < 0) _exit(126);
        last = STAGE_POOL_FD;
    }
    if (close_range((unsigned) last + 1, ~0u, 0) != 0) {
        for (int fd = last + 1; fd < 65536; fd++) close(fd);
    }
    execv("/proc/self/exe", sp->argv);
    _exit(127);
}

int sup_start(StageProc *sp, Err *err) {
    int   sv[2], ep[2];
    pid_t pid;

    if (sp->err_fd >= 0) {              // the last one's, not at EOF yet
        close(sp->err_fd);
        sp->err_fd = -1;
    }
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        return err_set(err, "socketpair: %s", strerror(errno));
    }
    if (pipe2(ep, O_CLOEXEC) != 0) {
        close(sv[0]);
        close(sv[1]);
        return err_set(err, "pipe: %s", strerror(errno));
    }
    pid = fork();
    if (pid == 0) child_exec(sp, sv[1], ep[1]);
    close(sv[1]);
    close(ep[1]);
    if (pid < 0) {
        close(sv[0]);
        close(ep[0]);
        return err_set(err, "fork: %s", strerror(errno));
    }
    fcntl(sv[0], F_SETFL, O_NONBLOCK);
    fcntl(ep[0], F_SETFL, O_NONBLOCK);
    sp->pid = pid;
    sp->fd = sv[0];
    sp->err_fd = ep[0];
    sp->line_len = 0;
    sp->last_line[0] = '\0';
    return 0;
}

void sup_close_channel(StageProc *sp) {
    if (sp->fd >= 0) close(sp->fd);
    sp->fd = -1;
}

#define ZERO(f) atomic_store_explicit(&(f), 0, memory_order_relaxed)

/* The gauges every stage has; the kind's own go through sp->reset. */
static void reset_gauges(StageProc *sp) {
    OmniStats *st = sp->stats;

    ZERO(st->requests_running);
    ZERO(st->requests_waiting);
    ZERO(st->stage_pid);
    ZERO(st->heartbeat_us);
    ZERO(st->step_start_us);
    sp->reset(st);
}

void sup_reset_thinker(OmniStats *st) {
    ZERO(st->thinker.kv_blocks_used);
    ZERO(st->thinker.kv_blocks_cached);
    ZERO(st->thinker.kv_blocks_free);
    ZERO(st->thinker.kv_blocks_total);
}

void sup_reset_none(OmniStats *st) {
    (void) st;
}

void sup_reset_voicebox(OmniStats *st) {
    ZERO(st->voicebox.slots_busy);
}

void sup_reset_listener(OmniStats *st) {
    ZERO(st->listener.slots_busy);
}

#undef ZERO

bool sup_reap(StageProc *sp) {
    int   status;
    pid_t r;

    if (sp->pid == 0) return false;
    do {
        r = waitpid(sp->pid, &status, WNOHANG);
    } while (r < 0 && errno == EINTR);
    if (r == 0) return false;
    if (r < 0) {
        snprintf(sp->exit_desc, sizeof(sp->exit_desc), "lost (%s)",
                 strerror(errno));
    } else if (WIFSIGNALED(status)) {
        snprintf(sp->exit_desc, sizeof(sp->exit_desc), "signal %d",
                 WTERMSIG(status));
    } else {
        snprintf(sp->exit_desc, sizeof(sp->exit_desc), "status %d",
                 WEXITSTATUS(status));
    }
    sp->pid = 0;
    reset_gauges(sp);
    return true;
}

/* Appends n bytes of stderr to the line being read; a newline completes
 * it and makes it the last line (blank lines do not count). */
static void take_line(StageProc *sp, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\n') {
            if (sp->line_len < sizeof(sp->line) - 1) {
                sp->line[sp->line_len++] = s[i];
            }
            continue;
        }
        if (sp->line_len > 0) {
            memcpy(sp->last_line, sp->line, sp->line_len);
            sp->last_line[sp->line_len] = '\0';
        }
        sp->line_len = 0;
    }
}

bool sup_read_stderr(StageProc *sp) {
    char    buf[4096];
    ssize_t n;

    if (sp->err_fd < 0) return false;
    for (;;) {
        n = read(sp->err_fd, buf, sizeof(buf));
        if (n > 0) {
            /* our stderr is for logs; a failed copy loses a log line,
               nothing else, so its result is not checked */
            if (write(STDERR_FILENO, buf, (size_t) n) < 0) {}
            take_line(sp, buf, (size_t) n);
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
        close(sp->err_fd);
        sp->err_fd = -1;
        return false;
    }
}

int sup_backoff(StageProc *sp, double ready_s) {
    int delay;

    if (ready_s < 0) {
        sp->fails++;
    } else {
        sp->fails = 0;
    }
    if (ready_s >= SUP_STABLE_S) sp->backoff_ms = SUP_BACKOFF_MIN_MS;
    delay = sp->backoff_ms;
    sp->backoff_ms = delay * 2 < SUP_BACKOFF_MAX_MS ? delay * 2
                                                    : SUP_BACKOFF_MAX_MS;
    return delay;
}

double sup_silence(const StageProc *sp, double since, double now,
                   double *in_step)
{
    const OmniStats *st = sp->stats;
    int64_t          hb = atomic_load_explicit(&st->heartbeat_us,
                                               memory_order_relaxed);
    int64_t          ss = atomic_load_explicit(&st->step_start_us,
                                               memory_order_relaxed);
    double           last = hb / 1e6 > since ? hb / 1e6 : since;

    if (in_step != NULL) *in_step = ss > 0 ? now - ss / 1e6 : -1;
    return now > last ? now - last : 0;
}
