/* listen.c -- the frontend's listening socket, its lock file and the
 * replacement of a live engine (--replace): binding the socket (a stale
 * one removed, a live one refused), accepting, pausing when descriptors
 * run out, removing the socket file only while it is still ours, and the
 * takeover of another engine's socket and lock.
 *
 * Separate because it is the engine's one public name on the file system
 * (the socket path, the lock file): everything that checks, renames or
 * removes those files is here, and none of it touches requests. */

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "frontend_impl.h"

#define LISTEN_PAUSE_S    0.1           // after EMFILE and friends


/* ---- Listener ----------------------------------------------------------- */

/* A live engine answers connect(); a stale socket file refuses it and is
 * removed. A path that exists but is not a socket is left alone. */
static int listen_check(const char *path, Err *err) {
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    struct stat        sb;
    int                fd, rc;

    if (lstat(path, &sb) != 0) {
        return errno == ENOENT ? 0 : err_set(err, "%s: %s", path,
                                             strerror(errno));
    }
    if (!S_ISSOCK(sb.st_mode)) {
        return err_set(err, "%s exists and is not a socket", path);
    }
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return err_set(err, "socket: %s", strerror(errno));
    memcpy(a.sun_path, path, strlen(path) + 1);
    rc = connect(fd, (struct sockaddr *) &a, sizeof(a));
    close(fd);
    if (rc == 0) {
        return err_set(err, "%s: another engine is serving on this socket",
                       path);
    }
    if (errno != ECONNREFUSED) return err_set(err, "%s: %s", path,
                                              strerror(errno));
    if (unlink(path) != 0) {
        return err_set(err, "%s: removing the stale socket: %s", path,
                       strerror(errno));
    }
    log_msg(LOG_INFO, "removed the stale socket %s", path);
    return 0;
}

/* Remembers which file the socket path names: ours, just after bind or
 * rename. */
static void listen_mark(Frontend *fe) {
    struct stat sb;

    fe->l_linked = lstat(fe->laddr.sun_path, &sb) == 0;
    if (!fe->l_linked) {
        log_msg(LOG_WARN, "%s: %s", fe->laddr.sun_path, strerror(errno));
        return;
    }
    fe->l_dev = sb.st_dev;
    fe->l_ino = sb.st_ino;
    fe->l_ctime = sb.st_ctim;
}

/* Whether the socket path still names the file we bound. After a
 * replacement took over it names that engine's; the ctime tells a reused
 * inode number apart (rename and bind both set it). */
static bool listen_owns_path(const Frontend *fe) {
    struct stat sb;

    return lstat(fe->laddr.sun_path, &sb) == 0 && sb.st_dev == fe->l_dev
           && sb.st_ino == fe->l_ino
           && sb.st_ctim.tv_sec == fe->l_ctime.tv_sec
           && sb.st_ctim.tv_nsec == fe->l_ctime.tv_nsec;
}

/* Binds cfg->socket_path, or <socket>.next for a candidate. The socket file
 * is created under a umask of at least 0117, so its mode is at most 0660:
 * whoever may connect is the engine's user or group, whatever umask we
 * were started with. There is a window between the check and bind in
 * which a second engine could start; bind then fails for one of them
 * (EADDRINUSE), which is the right outcome. */
int listen_open(Frontend *fe, Err *err) {
    const char *path = fe->cfg->socket_path;
    const char *sfx = fe->candidate ? ".next" : "";
    size_t      cap = sizeof(fe->laddr.sun_path);
    uint32_t    ev = 0;
    mode_t      mask;
    int         rc;

    fe->laddr.sun_family = AF_UNIX;
    if (strlen(path) + strlen(sfx) >= cap) {
        return err_set(err, "%s%s: socket path too long (at most %zu bytes)",
                       path, sfx, cap - 1);
    }
    memcpy(fe->laddr.sun_path, path, strlen(path));
    memcpy(fe->laddr.sun_path + strlen(path), sfx, strlen(sfx) + 1);
    if (listen_check(fe->laddr.sun_path, err) != 0) return -1;
    fe->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fe->lfd < 0) return err_set(err, "socket: %s", strerror(errno));
    mask = umask(0);
    umask(mask | 0117);
    rc = bind(fe->lfd, (struct sockaddr *) &fe->laddr, sizeof(fe->laddr));
    umask(mask);
    if (rc != 0 || listen(fe->lfd, SOMAXCONN) != 0) {
        err_set(err, "%s: %s", fe->laddr.sun_path, strerror(errno));
        close(fe->lfd);
        fe->lfd = -1;
        return -1;
    }
    listen_mark(fe);
    frontend_ep_set(fe, fe->lfd, &ev, EPOLLIN, &fe->s_listen);
    return 0;
}

/* Stops accepting; what is still queued is reset. The file stays. */
void listen_close(Frontend *fe) {
    if (fe->lfd < 0) return;
    close(fe->lfd);
    fe->lfd = -1;
    fe->listen_paused = false;
}

/* Removes the socket file, once, if the path still names it: after a
 * takeover it names the engine that replaced us, and removing it would cut
 * that engine off from nginx. (A replacement renames over the path before
 * it signals us, so the check and unlink cannot straddle that rename
 * unless something else stops us at the same moment.) */
void listen_unlink(Frontend *fe) {
    if (!fe->l_linked) return;
    fe->l_linked = false;
    if (!listen_owns_path(fe)) {
        log_msg(LOG_INFO, "%s is another engine's socket now; left in place",
                fe->laddr.sun_path);
        return;
    }
    if (unlink(fe->laddr.sun_path) != 0) {
        log_msg(LOG_WARN, "removing %s: %s", fe->laddr.sun_path,
                strerror(errno));
    }
}

/* Out of descriptors: stop accepting for a moment instead of spinning on
 * a listener that stays readable. */
void listen_pause(Frontend *fe, bool pause) {
    struct epoll_event ev = { .events = pause ? 0 : EPOLLIN,
                              .data.ptr = &fe->s_listen };

    if (fe->lfd < 0) return;
    epoll_ctl(fe->ep, EPOLL_CTL_MOD, fe->lfd, &ev);
    fe->listen_paused = pause;
    fe->listen_resume = clock_now_s() + LISTEN_PAUSE_S;
}

void listen_accept(Frontend *fe) {
    for (;;) {
        int fd = accept4(fe->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

        if (fd >= 0) {
            conn_accept(fe, fd);
            continue;
        }
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS
            || errno == ENOMEM)
        {
            log_msg(LOG_WARN, "accept: %s; pausing for %g s", strerror(errno),
                    LISTEN_PAUSE_S);
            listen_pause(fe, true);
        }
        return;
    }
}

/* Accepts what is queued, then reads what every connection still waiting
 * for its frame has sent. While draining: nginx writes its request right
 * after connect(), so a request queued in the backlog or just accepted is
 * answered (served while draining, 503 engine_shutdown after) instead of
 * being reset when the drain ends with nothing in flight. */
void listen_backlog(Frontend *fe) {
    while (fe->lfd >= 0) {
        int fd = accept4(fe->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            break;
        }
        conn_accept(fe, fd);
    }
    for (Conn *c = fe->rhead, *next; c != NULL; c = next) {
        next = c->rnext;                // conn_read takes c off the list
        conn_read(fe, c);
    }
}


/* ---- The lock file ------------------------------------------------------ */

/* One engine per lock file: an fcntl write lock on cfg->lock_file, taken
 * before the socket is touched and held until the process ends, when the
 * kernel drops it however we die. This is how nginx's omni_engine
 * directive supervises us: F_GETLK tells it in one call whether an engine
 * lives and its pid, where a pid file could name a dead or reused pid.
 * The descriptor is CLOEXEC so the stage never inherits it, and nothing
 * else in this process may open the file: closing any descriptor of it
 * would drop the lock (POSIX record-lock semantics). The pid written into
 * the file is for people; programs ask F_GETLK.
 *
 * With --replace, a held lock is not the end: the candidate locks
 * <lock-file>.next instead (one candidate at a time) and, at takeover,
 * renames it over the lock file. The lock belongs to the inode, so from
 * that instant F_GETLK on the path names the new engine, and the old one
 * keeps its lock on a file no path reaches until it exits. */

/* The pid holding a lock on path, 0 if none. Never used on a file this
 * process locks (see above). */
static pid_t lock_holder(const char *path) {
    struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
    int          fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0) return 0;
    if (fcntl(fd, F_GETLK, &fl) != 0) fl.l_type = F_UNLCK;
    close(fd);
    return fl.l_type == F_UNLCK ? 0 : fl.l_pid;
}

/* Locks path (created 0600) into *fd. Returns 0, -1 with err set, or 1
 * when another process holds it (err then says who). */
static int lock_try(const char *path, int *fd, Err *err) {
    struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
    pid_t        pid;
    int          e;

    *fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (*fd < 0) return err_set(err, "%s: %s", path, strerror(errno));
    if (fcntl(*fd, F_SETLK, &fl) == 0) {
        if (ftruncate(*fd, 0) == 0) dprintf(*fd, "%d\n", (int) getpid());
        return 0;
    }
    e = errno;
    close(*fd);
    *fd = -1;
    if (e != EAGAIN && e != EACCES) {
        return err_set(err, "%s: locking: %s", path, strerror(e));
    }
    pid = lock_holder(path);
    if (pid > 0) err_set(err, "another engine (pid %d) holds %s", (int) pid,
                         path);
    else err_set(err, "another engine held %s a moment ago", path);
    return 1;
}

int listen_lock(Frontend *fe, Err *err) {
    const char *path = fe->cfg->lock_file;
    int         rc;

    if (path == NULL) return 0;
    rc = lock_try(path, &fe->lock_fd, err);
    if (rc <= 0 || !fe->cfg->replace) return rc == 0 ? 0 : -1;
    if ((size_t) snprintf(fe->lock_next, sizeof(fe->lock_next), "%s.next",
                          path) >= sizeof(fe->lock_next))
    {
        return err_set(err, "%s: path too long", path);
    }
    log_msg(LOG_INFO, "%s: starting beside it, in its place once ready",
            err->msg);
    if (lock_try(fe->lock_next, &fe->lock_fd, err) != 0) {
        return err_prefix(err, "another replacement is starting");
    }
    fe->candidate = true;
    return 0;
}


/* ---- Replacement -------------------------------------------------------- */

/* A candidate's stages are ready: take the live engine's place. The socket
 * first: rename(2) is atomic, so every connect() from now on reaches us
 * and none finds the path missing, while what is queued at the old engine
 * stays there and is served by it. Then the lock, so that F_GETLK on
 * --lock-file names us (and a second engine is refused by us). Then the
 * old engine, found by its lock before the renames, is told to drain.
 * If the socket cannot be renamed the old engine keeps serving and we
 * shut down: we can serve no one. */
void listen_takeover(Frontend *fe) {
    const ServeConfig *cfg = fe->cfg;
    pid_t              old = lock_holder(cfg->lock_file);
    char               from[sizeof(fe->laddr.sun_path)];

    memcpy(from, fe->laddr.sun_path, sizeof(from));
    if (rename(from, cfg->socket_path) != 0) {
        log_msg(LOG_ERROR, "taking over %s: renaming %s: %s",
                cfg->socket_path, from, strerror(errno));
        frontend_stop(fe, "could not take over the socket");
        return;
    }
    snprintf(fe->laddr.sun_path, sizeof(fe->laddr.sun_path), "%s",
             cfg->socket_path);
    listen_mark(fe);                    // the rename set a new ctime
    if (rename(fe->lock_next, cfg->lock_file) != 0) {
        log_msg(LOG_ERROR, "taking over %s: renaming %s: %s", cfg->lock_file,
                fe->lock_next, strerror(errno));
    }
    fe->candidate = false;
    if (old <= 0) {
        log_msg(LOG_INFO, "serving on %s (the engine before is gone)",
                cfg->socket_path);
        return;
    }
    log_msg(LOG_INFO, "serving on %s in place of pid %d, which drains and "
            "exits", cfg->socket_path, (int) old);
    if (kill(old, SIGTERM) != 0) {
        log_msg(LOG_WARN, "kill(%d, SIGTERM): %s", (int) old,
                strerror(errno));
    }
}


