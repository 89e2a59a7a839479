
/*
 * Copyright (C) ngx_omni authors
 */


/*
 * ngx_omni_engine_proc.c -- one engine process, as the master and the
 * cache manager see it: the state directory's ownership, who holds a lock
 * file (F_GETLK), whether a pid runs the configured command line
 * (engine.cmd against /proc/PID/cmdline), the last line of engine.log,
 * and the double fork that starts an engine. Each function answers one
 * question or does one thing and keeps no state: the policy is
 * ngx_omni_engine_manager.c's.
 */


#include <ngx_config.h>
#include <ngx_core.h>

#include <grp.h>

#include "ngx_omni_engine_module.h"


static ngx_int_t ngx_omni_engine_compare(ngx_cycle_t *cycle,
    ngx_omni_engine_conf_t *oecf, u_char *file);
static ngx_uint_t ngx_omni_engine_quiet_line(u_char *p, u_char *end);
static void ngx_omni_engine_exec(ngx_cycle_t *cycle,
    ngx_omni_engine_conf_t *oecf, char **env);

/*
 * The state directory holds the engine's lock and log, and usually its
 * socket: the engine's user has business there, its group perhaps (read
 * and search, if the directory allows it), nobody else.  nginx creates it
 * 0700 but leaves an existing directory's mode as it is.
 */

void
ngx_omni_engine_private(ngx_cycle_t *cycle, ngx_omni_engine_conf_t *oecf)
{
    ngx_file_info_t  fi;

    if (ngx_file_info(oecf->state_dir.data, &fi) == NGX_FILE_ERROR) {
        ngx_log_error(NGX_LOG_ALERT, cycle->log, ngx_errno,
                      ngx_file_info_n " \"%V\" failed", &oecf->state_dir);
        return;
    }

    if ((fi.st_mode & 0027) == 0) {
        return;
    }

    if (chmod((char *) oecf->state_dir.data, fi.st_mode & 07750) == -1) {
        ngx_log_error(NGX_LOG_ALERT, cycle->log, ngx_errno,
                      "chmod(\"%V\") failed", &oecf->state_dir);
        return;
    }

    ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                  "omni_engine_state_dir \"%V\" was open to others "
                  "(mode 0%uD%uD%uD), now 0%uD%uD0", &oecf->state_dir,
                  (uint32_t) (fi.st_mode >> 6) & 7,
                  (uint32_t) (fi.st_mode >> 3) & 7,
                  (uint32_t) fi.st_mode & 7,
                  (uint32_t) (fi.st_mode >> 6) & 7,
                  (uint32_t) (fi.st_mode >> 3) & 5);
}


/* the pid of the process holding a lock on the file, 0 if none */

ngx_pid_t
ngx_omni_engine_holder(u_char *lock_file)
{
    ngx_fd_t      fd;
    struct flock  fl;

    fd = ngx_open_file(lock_file,
                       NGX_FILE_RDONLY|NGX_FILE_NONBLOCK|NGX_FILE_NOFOLLOW,
                       NGX_FILE_OPEN, 0);
    if (fd == NGX_INVALID_FILE) {
        return 0;
    }

    ngx_memzero(&fl, sizeof(struct flock));
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;

    if (fcntl(fd, F_GETLK, &fl) == -1) {
        fl.l_type = F_UNLCK;
    }

    (void) ngx_close_file(fd);

    return (fl.l_type == F_UNLCK) ? 0 : fl.l_pid;
}


/*
 * Whether engine.lock names pid: an engine writes its pid there once it
 * holds the lock (or renames its own lock file there), so this tells an
 * engine that started and then exited from one that never did.
 */

ngx_uint_t
ngx_omni_engine_locked(ngx_omni_engine_conf_t *oecf, ngx_pid_t pid)
{
    u_char    *p, buf[NGX_INT64_LEN + 2];
    ssize_t    n;
    ngx_fd_t   fd;

    fd = ngx_open_file(oecf->lock_file,
                       NGX_FILE_RDONLY|NGX_FILE_NONBLOCK|NGX_FILE_NOFOLLOW,
                       NGX_FILE_OPEN, 0);
    if (fd == NGX_INVALID_FILE) {
        return 0;
    }

    n = ngx_read_fd(fd, buf, sizeof(buf));
    (void) ngx_close_file(fd);

    if (n <= 0) {
        return 0;
    }

    for (p = buf; p < buf + n && *p >= '0' && *p <= '9'; p++) {
        /* void */
    }

    return ngx_atoi(buf, p - buf) == pid;
}


/*
 * Whether the process exists and is not a zombie: the engine is nobody's
 * child (double fork), and an init that does not reap would keep it a
 * zombie for good.  Without /proc, kill(pid, 0) tells.
 */

ngx_uint_t
ngx_omni_engine_alive(ngx_pid_t pid)
{
    u_char    *p, buf[256];
    u_char     name[sizeof("/proc//stat") + NGX_INT64_LEN];
    ssize_t    n;
    ngx_fd_t   fd;

    ngx_sprintf(name, "/proc/%P/stat%Z", pid);

    fd = ngx_open_file(name, NGX_FILE_RDONLY, NGX_FILE_OPEN, 0);
    if (fd == NGX_INVALID_FILE) {
        return kill(pid, 0) == 0 || ngx_errno == NGX_EPERM;
    }

    n = ngx_read_fd(fd, buf, sizeof(buf) - 1);
    (void) ngx_close_file(fd);

    if (n <= 0) {
        return 0;
    }

    buf[n] = '\0';

    /* "pid (comm) state ...", and comm may hold any character */

    p = (u_char *) strrchr((char *) buf, ')');

    if (p == NULL || p + 2 >= buf + n) {
        return 1;
    }

    return p[2] != 'Z' && p[2] != 'X';
}


/*
 * Compares a file with this configuration's command line: NGX_OK when it
 * holds exactly that (in the format of /proc/PID/cmdline), NGX_DECLINED
 * when it holds something else, NGX_ERROR when it cannot be read.
 */

static ngx_int_t
ngx_omni_engine_compare(ngx_cycle_t *cycle, ngx_omni_engine_conf_t *oecf,
    u_char *file)
{
    u_char     *buf;
    size_t      size;
    ssize_t     n;
    ngx_fd_t    fd;
    ngx_int_t   rc;

    fd = ngx_open_file(file,
                       NGX_FILE_RDONLY|NGX_FILE_NONBLOCK|NGX_FILE_NOFOLLOW,
                       NGX_FILE_OPEN, 0);
    if (fd == NGX_INVALID_FILE) {
        return NGX_ERROR;
    }

    buf = ngx_alloc(oecf->cmdline.len + 1, cycle->log);
    if (buf == NULL) {
        (void) ngx_close_file(fd);
        return NGX_ERROR;
    }

    /* /proc files may come in pieces */

    size = 0;

    do {
        n = ngx_read_fd(fd, buf + size, oecf->cmdline.len + 1 - size);

        if (n > 0) {
            size += n;
        }

    } while (n > 0 && size < oecf->cmdline.len + 1);

    if (n == -1) {
        rc = NGX_ERROR;

    } else if (size == oecf->cmdline.len
               && ngx_memcmp(buf, oecf->cmdline.data, size) == 0)
    {
        rc = NGX_OK;

    } else {
        rc = NGX_DECLINED;
    }

    ngx_free(buf);
    (void) ngx_close_file(fd);

    return rc;
}


/*
 * Whether engine.cmd holds this configuration's command line: that is,
 * whether this is the newest configuration.  A missing or unreadable file
 * counts as another command line.
 */

ngx_uint_t
ngx_omni_engine_recorded(ngx_cycle_t *cycle, ngx_omni_engine_conf_t *oecf)
{
    ngx_int_t  rc;

    rc = ngx_omni_engine_compare(cycle, oecf, oecf->cmd_file);

    if (rc == NGX_ERROR && !oecf->unreadable) {
        ngx_log_error(NGX_LOG_ALERT, cycle->log, ngx_errno,
                      "omni engine: cannot read \"%s\", leaving the engine "
                      "alone", oecf->cmd_file);
        oecf->unreadable = 1;
    }

    return rc == NGX_OK;
}


/*
 * Whether the engine runs this configuration's command line.  One that
 * cannot be read (no /proc, or it is hidden) counts as the same: the
 * engine is kept rather than replaced again and again.
 */

ngx_uint_t
ngx_omni_engine_runs(ngx_cycle_t *cycle, ngx_omni_engine_conf_t *oecf,
    ngx_pid_t pid)
{
    u_char  name[sizeof("/proc//cmdline") + NGX_INT64_LEN];

    ngx_sprintf(name, "/proc/%P/cmdline%Z", pid);

    return ngx_omni_engine_compare(cycle, oecf, name) != NGX_DECLINED;
}


/*
 * Writes engine.cmd through a rename, so that readers never see half of
 * it.  The master may be root and the directory the worker user's: the
 * temporary file is created anew (O_EXCL), never opened through a link
 * someone else put there.
 */

void
ngx_omni_engine_record(ngx_cycle_t *cycle, ngx_omni_engine_conf_t *oecf)
{
    ssize_t           n;
    ngx_fd_t          fd;
    ngx_core_conf_t  *ccf;

    if (ngx_delete_file(oecf->cmd_temp) == NGX_FILE_ERROR
        && ngx_errno != NGX_ENOENT)
    {
        ngx_log_error(NGX_LOG_ALERT, cycle->log, ngx_errno,
                      ngx_delete_file_n " \"%s\" failed", oecf->cmd_temp);
        return;
    }

    fd = ngx_open_file(oecf->cmd_temp, NGX_FILE_WRONLY,
                       NGX_FILE_CREATE_OR_OPEN|O_EXCL, 0600);
    if (fd == NGX_INVALID_FILE) {
        ngx_log_error(NGX_LOG_ALERT, cycle->log, ngx_errno,
                      ngx_open_file_n " \"%s\" failed", oecf->cmd_temp);
        return;
    }

    /* the cache manager, which reads it, runs as the worker user */

    ccf = (ngx_core_conf_t *) ngx_get_conf(cycle->conf_ctx, ngx_core_module);

    if (geteuid() == 0 && ccf->user != (ngx_uid_t) NGX_CONF_UNSET_UINT
        && fchown(fd, ccf->user, ccf->group) == -1)
    {
        ngx_log_error(NGX_LOG_ALERT, cycle->log, ngx_errno,
                      "fchown(\"%s\") failed", oecf->cmd_temp);
    }

    n = ngx_write_fd(fd, oecf->cmdline.data, oecf->cmdline.len);

    if (ngx_close_file(fd) == NGX_FILE_ERROR
        || n != (ssize_t) oecf->cmdline.len)
    {
        ngx_log_error(NGX_LOG_ALERT, cycle->log, ngx_errno,
                      "writing \"%s\" failed", oecf->cmd_temp);
        return;
    }

    if (ngx_rename_file(oecf->cmd_temp, oecf->cmd_file) == NGX_FILE_ERROR) {
        ngx_log_error(NGX_LOG_ALERT, cycle->log, ngx_errno,
                      ngx_rename_file_n " \"%s\" to \"%s\" failed",
                      oecf->cmd_temp, oecf->cmd_file);
    }
}


/*
 * The last line engine.log received since the engine being watched
 * started (the tail of the file when that is unknown) that is not at info
 * or debug level, else its last line, for the error log: usually why the
 * engine failed ("... No such file or directory").  The other stages keep
 * starting while a failing one is retried, so the very last line is as
 * likely another stage's "ready" as the failure.  Two engines share the
 * file during a replacement, but a serving engine is quiet, so the line
 * is almost always the new one's.
 */

void
ngx_omni_engine_last_line(ngx_omni_engine_conf_t *oecf, u_char *buf,
    size_t size, ngx_str_t *line)
{
    off_t             from;
    u_char           *p, *last, *end, *first, *first_end;
    ssize_t           n;
    ngx_fd_t          fd;
    ngx_file_info_t   fi;

    ngx_str_set(line, "(nothing)");

    fd = ngx_open_file(oecf->log_file, NGX_FILE_RDONLY|NGX_FILE_NONBLOCK,
                       NGX_FILE_OPEN, 0);
    if (fd == NGX_INVALID_FILE) {
        return;
    }

    if (ngx_fd_info(fd, &fi) == NGX_FILE_ERROR) {
        (void) ngx_close_file(fd);
        return;
    }

    from = ngx_file_size(&fi) - (off_t) size;

    if (from < oecf->log_size && oecf->log_size <= ngx_file_size(&fi)) {
        from = oecf->log_size;
    }

    n = pread(fd, buf, size, ngx_max(from, 0));
    (void) ngx_close_file(fd);

    if (n <= 0) {
        return;
    }

    last = buf + n;

    while (last > buf && (last[-1] == LF || last[-1] == CR)) {
        last--;
    }

    first = NULL;
    first_end = NULL;

    for (end = last; end > buf; end = p) {

        for (p = end; p > buf && p[-1] != LF; p--) { /* void */ }

        if (p < end) {
            if (first == NULL) {
                first = p;
                first_end = end;
            }

            if (!ngx_omni_engine_quiet_line(p, end)) {
                line->data = p;
                line->len = end - p;
                return;
            }
        }

        while (p > buf && (p[-1] == LF || p[-1] == CR)) {
            p--;
        }
    }

    if (first != NULL) {
        line->data = first;
        line->len = first_end - first;
    }
}


/* an engine log line at info or debug level (log.c's format) */

static ngx_uint_t
ngx_omni_engine_quiet_line(u_char *p, u_char *end)
{
    static ngx_str_t  quiet[] = {
        ngx_string("omni-engine [info] "),
        ngx_string("omni-engine [debug] "),
    };

    ngx_uint_t  i;

    for (i = 0; i < sizeof(quiet) / sizeof(quiet[0]); i++) {
        if ((size_t) (end - p) >= quiet[i].len
            && ngx_strncmp(p, quiet[i].data, quiet[i].len) == 0)
        {
            return 1;
        }
    }

    return 0;
}


/*
 * Starts the engine, detached (double fork).  Returns its pid, which the
 * middle process reports through a pipe, or 0.  Nothing waits for the
 * engine: the cache manager looks at its lock on the next checks.
 */

ngx_pid_t
ngx_omni_engine_spawn(ngx_cycle_t *cycle, ngx_omni_engine_conf_t *oecf)
{
    int               fd[2], status;
    char            **env;
    ngx_pid_t         pid, engine;
    sigset_t          set, old;
    ngx_uint_t        n;
    ngx_file_info_t   fi;

    /* the environment of nginx's workers: TZ and the "env" directives */

    n = 0;
    env = ngx_set_environment(cycle, &n);
    if (env == NULL) {
        return 0;
    }

    if (pipe2(fd, O_CLOEXEC) == -1) {
        ngx_log_error(NGX_LOG_ALERT, cycle->log, ngx_errno,
                      "pipe2() failed while starting omni engine");
        ngx_free(env);
        return 0;
    }

    oecf->log_size = (ngx_file_info(oecf->log_file, &fi) == NGX_FILE_ERROR)
                     ? 0 : ngx_file_size(&fi);

    /* nginx's SIGCHLD handler must not reap the intermediate child */

    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigprocmask(SIG_BLOCK, &set, &old);

    pid = fork();

    if (pid == 0) {
        (void) setsid();

        engine = fork();

        if (engine == 0) {
            ngx_omni_engine_exec(cycle, oecf, env);
        }

        if (write(fd[1], &engine, sizeof(ngx_pid_t)) != sizeof(ngx_pid_t)) {
            _exit(1);
        }

        _exit(0);
    }

    (void) close(fd[1]);
    engine = 0;

    if (pid == -1) {
        ngx_log_error(NGX_LOG_ALERT, cycle->log, ngx_errno,
                      "fork() failed while starting omni engine");

    } else {
        while (waitpid(pid, &status, 0) == -1 && ngx_errno == NGX_EINTR) {
            /* void */
        }

        if (read(fd[0], &engine, sizeof(ngx_pid_t)) != sizeof(ngx_pid_t)
            || engine <= 0)
        {
            ngx_log_error(NGX_LOG_ALERT, cycle->log, 0,
                          "fork() failed while starting omni engine");
            engine = 0;
        }
    }

    (void) close(fd[0]);
    sigprocmask(SIG_SETMASK, &old, NULL);
    ngx_free(env);

    return engine;
}


/* the grandchild: becomes the engine or exits */

static void
ngx_omni_engine_exec(ngx_cycle_t *cycle, ngx_omni_engine_conf_t *oecf,
    char **env)
{
    int               i;
    ngx_fd_t          fd;
    sigset_t          set;
    ngx_file_info_t   fi;
    ngx_core_conf_t  *ccf;

    sigemptyset(&set);
    sigprocmask(SIG_SETMASK, &set, NULL);

    for (i = 1; i < NSIG; i++) {
        (void) signal(i, SIG_DFL);      /* SIG_IGN would survive execve */
    }

    ccf = (ngx_core_conf_t *) ngx_get_conf(cycle->conf_ctx, ngx_core_module);

    if (geteuid() == 0 && ccf->user != (ngx_uid_t) NGX_CONF_UNSET_UINT) {
        if (setgid(ccf->group) == -1
            || initgroups(ccf->username, ccf->group) == -1
            || setuid(ccf->user) == -1)
        {
            ngx_log_stderr(ngx_errno, "omni engine: switching to user "
                           "\"%s\" failed", ccf->username);
            _exit(126);
        }
    }

    (void) umask(007);

    fd = open("/dev/null", O_RDONLY);
    if (fd != -1) {
        (void) dup2(fd, STDIN_FILENO);
    }

    /*
     * after the user switch: the file belongs to the engine's user, and
     * what the engine logs is for it and its group only
     */

    fd = open((char *) oecf->log_file, O_WRONLY|O_APPEND|O_CREAT, 0640);
    if (fd != -1) {
        if (ngx_fd_info(fd, &fi) != NGX_FILE_ERROR
            && (fi.st_mode & 0027))
        {
            (void) fchmod(fd, fi.st_mode & 0750);
        }

        (void) dup2(fd, STDOUT_FILENO);
        (void) dup2(fd, STDERR_FILENO);
    }

    /* listening sockets, channels and log files are not close-on-exec */

    (void) close_range(3, ~0U, 0);

    if (chdir((char *) oecf->prefix) == -1) {
        ngx_log_stderr(ngx_errno, "omni engine: chdir(\"%s\") failed",
                       oecf->prefix);
    }

    execve(oecf->argv[0], oecf->argv, env);

    ngx_log_stderr(ngx_errno, "omni engine: execve(\"%s\") failed",
                   oecf->argv[0]);

    _exit(127);
}
