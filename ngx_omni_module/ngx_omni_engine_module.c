
/*
 * Copyright (C) ngx_omni authors
 */


/*
 * The omni_engine directive: nginx's master starts omni-engine, keeps it
 * across reloads, restarts it when it dies and stops it on exit.
 *
 * nginx 1.22 has no hook for a long-lived helper process of a module (an
 * entry added to ngx_processes[] is signalled like a worker on every
 * reload, a detached one is never respawned), so this module is built
 * from the pieces that exist:
 *
 *  - Liveness and singleton: the engine holds an fcntl write lock on
 *    <state_dir>/engine.lock (it is given --lock-file); F_GETLK says
 *    whether one runs and its pid, with no pid file that could go stale.
 *    A second engine on the same lock file exits at once.
 *
 *  - Start: init_module, which runs in the master on start and on every
 *    reload (and for "nginx -t", where it does nothing).  A running
 *    engine is kept when the command line is the one recorded in
 *    <state_dir>/engine.cmd, so a reload does not restart it; otherwise
 *    it gets SIGTERM and the new command line is started.
 *
 *  - Respawn: the state directory is registered as an ngx_path_t with a
 *    manager callback, which makes the master run its "cache manager
 *    process" (itself respawned if it dies and restarted on reload); it
 *    calls ngx_omni_engine_manager() every omni_engine_check_interval.
 *    The cache manager exists only with "master_process on".
 *
 *  - Spawn: double fork and setsid, so no nginx process has to reap the
 *    engine and no terminal signal reaches it; in the engine, before
 *    execve: the signal mask emptied and dispositions reset (the master
 *    blocks HUP, TERM, CHLD... and ignores PIPE, and both survive
 *    execve), every descriptor from 3 up closed (listening sockets and
 *    logs are not close-on-exec), the worker user when nginx runs as
 *    root, the prefix as working directory, stdout and stderr to
 *    <state_dir>/engine.log, and the environment nginx gives its workers.
 *
 *  - Stop: exit_master sends SIGTERM to the lock holder and waits a
 *    little for it to go.
 */


#include <ngx_config.h>
#include <ngx_core.h>

#include <grp.h>


#define NGX_OMNI_ENGINE_START_WAIT   1000     /* ms for a new engine to lock */
#define NGX_OMNI_ENGINE_STOP_WAIT    2000     /* ms on reload; then the cache
                                                 manager takes over */
#define NGX_OMNI_ENGINE_EXIT_WAIT    5000     /* ms when nginx exits */
#define NGX_OMNI_ENGINE_FAST_FAIL    10000    /* died this soon: back off */
#define NGX_OMNI_ENGINE_MAX_BACKOFF  60000


typedef struct {
    ngx_array_t      *args;         /* of ngx_str_t, the directive's */
    ngx_str_t         state_dir;
    ngx_msec_t        interval;

    char            **argv;         /* args, "--lock-file", lock_file, NULL;
                                       argv[0] is a full path */
    ngx_str_t         cmdline;      /* argv, each followed by NUL: the
                                       contents of engine.cmd */
    u_char           *prefix;       /* the engine's working directory */
    u_char           *lock_file;    /* NUL-terminated, as the three below */
    u_char           *log_file;
    u_char           *cmd_file;
    u_char           *cmd_temp;

    /* the cache manager process's own state */
    ngx_pid_t         seen;         /* the engine found at the last check */
    ngx_msec_t        started;      /* when this process last spawned one */
    ngx_msec_t        backoff;
} ngx_omni_engine_conf_t;


static void *ngx_omni_engine_create_conf(ngx_cycle_t *cycle);
static char *ngx_omni_engine_init_conf(ngx_cycle_t *cycle, void *conf);
static char *ngx_omni_engine(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);
static ngx_int_t ngx_omni_engine_init_module(ngx_cycle_t *cycle);
static void ngx_omni_engine_exit_master(ngx_cycle_t *cycle);
static ngx_msec_t ngx_omni_engine_manager(void *data);
static ngx_int_t ngx_omni_engine_build(ngx_cycle_t *cycle,
    ngx_omni_engine_conf_t *oecf);
static ngx_int_t ngx_omni_engine_add_path(ngx_cycle_t *cycle,
    ngx_omni_engine_conf_t *oecf);
static ngx_pid_t ngx_omni_engine_holder(ngx_omni_engine_conf_t *oecf);
static ngx_pid_t ngx_omni_engine_wait(ngx_omni_engine_conf_t *oecf,
    ngx_uint_t held, ngx_msec_t ms);
static ngx_int_t ngx_omni_engine_recorded(ngx_cycle_t *cycle,
    ngx_omni_engine_conf_t *oecf);
static void ngx_omni_engine_record(ngx_cycle_t *cycle,
    ngx_omni_engine_conf_t *oecf);
static ngx_pid_t ngx_omni_engine_spawn(ngx_cycle_t *cycle,
    ngx_omni_engine_conf_t *oecf);
static void ngx_omni_engine_exec(ngx_cycle_t *cycle,
    ngx_omni_engine_conf_t *oecf, char **env);


static ngx_command_t  ngx_omni_engine_commands[] = {

    { ngx_string("omni_engine"),
      NGX_MAIN_CONF|NGX_DIRECT_CONF|NGX_CONF_1MORE,
      ngx_omni_engine,
      0,
      0,
      NULL },

    { ngx_string("omni_engine_state_dir"),
      NGX_MAIN_CONF|NGX_DIRECT_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      0,
      offsetof(ngx_omni_engine_conf_t, state_dir),
      NULL },

    { ngx_string("omni_engine_check_interval"),
      NGX_MAIN_CONF|NGX_DIRECT_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      0,
      offsetof(ngx_omni_engine_conf_t, interval),
      NULL },

      ngx_null_command
};


static ngx_core_module_t  ngx_omni_engine_module_ctx = {
    ngx_string("omni_engine"),
    ngx_omni_engine_create_conf,
    ngx_omni_engine_init_conf
};


ngx_module_t  ngx_omni_engine_module = {
    NGX_MODULE_V1,
    &ngx_omni_engine_module_ctx,           /* module context */
    ngx_omni_engine_commands,              /* module directives */
    NGX_CORE_MODULE,                       /* module type */
    NULL,                                  /* init master: never called */
    ngx_omni_engine_init_module,           /* init module */
    NULL,                                  /* init process */
    NULL,                                  /* init thread */
    NULL,                                  /* exit thread */
    NULL,                                  /* exit process */
    ngx_omni_engine_exit_master,           /* exit master */
    NGX_MODULE_V1_PADDING
};


static void *
ngx_omni_engine_create_conf(ngx_cycle_t *cycle)
{
    ngx_omni_engine_conf_t  *oecf;

    oecf = ngx_pcalloc(cycle->pool, sizeof(ngx_omni_engine_conf_t));
    if (oecf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     oecf->args = NULL;
     *     oecf->state_dir = { 0, NULL };
     *     oecf->argv = NULL;
     *     oecf->seen = 0;
     *     oecf->started = 0;
     *     oecf->backoff = 0;
     */

    oecf->interval = NGX_CONF_UNSET_MSEC;

    return oecf;
}


static char *
ngx_omni_engine(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_omni_engine_conf_t *oecf = conf;

    ngx_str_t   *value, *arg;
    ngx_uint_t   i;

    if (oecf->args != NULL) {
        return "is duplicate";
    }

    value = cf->args->elts;

    oecf->args = ngx_array_create(cf->pool, cf->args->nelts - 1,
                                  sizeof(ngx_str_t));
    if (oecf->args == NULL) {
        return NGX_CONF_ERROR;
    }

    for (i = 1; i < cf->args->nelts; i++) {

        if (value[i].len == sizeof("--lock-file") - 1
            && ngx_strcmp(value[i].data, "--lock-file") == 0)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"%V\" is set by nginx: it is "
                               "omni_engine_state_dir/engine.lock",
                               &value[i]);
            return NGX_CONF_ERROR;
        }

        arg = ngx_array_push(oecf->args);
        if (arg == NULL) {
            return NGX_CONF_ERROR;
        }

        *arg = value[i];            /* conf tokens are NUL-terminated */
    }

    arg = oecf->args->elts;

    /* the binary, like every nginx path, is relative to the prefix */

    if (ngx_conf_full_name(cf->cycle, &arg[0], 0) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    if (access((char *) arg[0].data, X_OK) == -1) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, ngx_errno,
                           "omni engine \"%V\" is not executable", &arg[0]);
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


static char *
ngx_omni_engine_init_conf(ngx_cycle_t *cycle, void *conf)
{
    ngx_omni_engine_conf_t *oecf = conf;

    ngx_conf_init_msec_value(oecf->interval, 1000);

    if (oecf->state_dir.data == NULL) {
        ngx_str_set(&oecf->state_dir, "omni");
    }

    if (oecf->args == NULL) {
        return NGX_CONF_OK;         /* loaded, not used */
    }

    if (oecf->interval == 0) {
        ngx_log_error(NGX_LOG_EMERG, cycle->log, 0,
                      "\"omni_engine_check_interval\" must be more than 0");
        return NGX_CONF_ERROR;
    }

    if (ngx_conf_full_name(cycle, &oecf->state_dir, 0) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    if (ngx_omni_engine_build(cycle, oecf) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    if (ngx_omni_engine_add_path(cycle, oecf) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


/* file names, argv and the recorded form of the command line */

static ngx_int_t
ngx_omni_engine_build(ngx_cycle_t *cycle, ngx_omni_engine_conf_t *oecf)
{
    size_t       len;
    u_char      *p;
    ngx_str_t   *arg;
    ngx_uint_t   i, n;

    len = oecf->state_dir.len + sizeof("/engine.cmd.tmp");

    oecf->lock_file = ngx_pnalloc(cycle->pool, len);
    oecf->log_file = ngx_pnalloc(cycle->pool, len);
    oecf->cmd_file = ngx_pnalloc(cycle->pool, len);
    oecf->cmd_temp = ngx_pnalloc(cycle->pool, len);
    oecf->prefix = ngx_pnalloc(cycle->pool, cycle->prefix.len + 1);

    if (oecf->lock_file == NULL || oecf->log_file == NULL
        || oecf->cmd_file == NULL || oecf->cmd_temp == NULL
        || oecf->prefix == NULL)
    {
        return NGX_ERROR;
    }

    ngx_sprintf(oecf->lock_file, "%V/engine.lock%Z", &oecf->state_dir);
    ngx_sprintf(oecf->log_file, "%V/engine.log%Z", &oecf->state_dir);
    ngx_sprintf(oecf->cmd_file, "%V/engine.cmd%Z", &oecf->state_dir);
    ngx_sprintf(oecf->cmd_temp, "%V/engine.cmd.tmp%Z", &oecf->state_dir);
    ngx_sprintf(oecf->prefix, "%V%Z", &cycle->prefix);

    n = oecf->args->nelts;
    arg = oecf->args->elts;

    oecf->argv = ngx_palloc(cycle->pool, (n + 3) * sizeof(char *));
    if (oecf->argv == NULL) {
        return NGX_ERROR;
    }

    for (i = 0; i < n; i++) {
        oecf->argv[i] = (char *) arg[i].data;
    }

    oecf->argv[n] = "--lock-file";
    oecf->argv[n + 1] = (char *) oecf->lock_file;
    oecf->argv[n + 2] = NULL;

    len = 0;
    for (i = 0; oecf->argv[i]; i++) {
        len += ngx_strlen(oecf->argv[i]) + 1;
    }

    p = ngx_pnalloc(cycle->pool, len);
    if (p == NULL) {
        return NGX_ERROR;
    }

    oecf->cmdline.data = p;
    oecf->cmdline.len = len;

    for (i = 0; oecf->argv[i]; i++) {
        p = ngx_cpymem(p, oecf->argv[i], ngx_strlen(oecf->argv[i]));
        *p++ = '\0';
    }

    return NGX_OK;
}


/*
 * The state directory as a "path" with a manager callback: nginx creates
 * it (0700, owned by the worker user) and, with master_process on, runs a
 * cache manager process that calls ngx_omni_engine_manager().
 */

static ngx_int_t
ngx_omni_engine_add_path(ngx_cycle_t *cycle, ngx_omni_engine_conf_t *oecf)
{
    ngx_uint_t    i;
    ngx_path_t  **p, *path;

    p = cycle->paths.elts;
    for (i = 0; i < cycle->paths.nelts; i++) {
        if (p[i]->name.len == oecf->state_dir.len
            && ngx_strcmp(p[i]->name.data, oecf->state_dir.data) == 0)
        {
            ngx_log_error(NGX_LOG_EMERG, cycle->log, 0,
                          "\"omni_engine_state_dir\" \"%V\" is used by "
                          "another directive", &oecf->state_dir);
            return NGX_ERROR;
        }
    }

    path = ngx_pcalloc(cycle->pool, sizeof(ngx_path_t));
    if (path == NULL) {
        return NGX_ERROR;
    }

    path->name = oecf->state_dir;
    path->manager = ngx_omni_engine_manager;
    path->data = oecf;
    path->conf_file = (u_char *) "omni_engine_state_dir";

    p = ngx_array_push(&cycle->paths);
    if (p == NULL) {
        return NGX_ERROR;
    }

    *p = path;

    return NGX_OK;
}


/*
 * Runs in the master, on start and on every reload.  It never returns
 * NGX_ERROR: ngx_init_cycle() would exit(1), killing a running master.
 */

static ngx_int_t
ngx_omni_engine_init_module(ngx_cycle_t *cycle)
{
    ngx_pid_t                pid;
    ngx_uint_t               same;
    ngx_core_conf_t         *ccf;
    ngx_omni_engine_conf_t  *oecf;

    oecf = (ngx_omni_engine_conf_t *) ngx_get_conf(cycle->conf_ctx,
                                                   ngx_omni_engine_module);

    if (oecf == NULL || oecf->args == NULL || ngx_test_config) {
        return NGX_OK;
    }

    ccf = (ngx_core_conf_t *) ngx_get_conf(cycle->conf_ctx, ngx_core_module);

    if (!ccf->master) {
        ngx_log_error(NGX_LOG_WARN, cycle->log, 0,
                      "omni_engine with \"master_process off\": the engine "
                      "is started but not restarted if it dies");
    }

    same = ngx_omni_engine_recorded(cycle, oecf);
    ngx_omni_engine_record(cycle, oecf);

    pid = ngx_omni_engine_holder(oecf);

    if (pid > 0 && same) {
        ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                      "omni engine (pid %P) already running, kept", pid);
        return NGX_OK;
    }

    if (pid > 0) {
        ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                      "omni engine command line changed, stopping "
                      "pid %P", pid);

        if (kill(pid, SIGTERM) == -1) {
            ngx_log_error(NGX_LOG_ALERT, cycle->log, ngx_errno,
                          "kill(%P, SIGTERM) failed", pid);
            return NGX_OK;
        }

        pid = ngx_omni_engine_wait(oecf, 0, NGX_OMNI_ENGINE_STOP_WAIT);

        if (pid > 0) {
            ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                          "omni engine (pid %P) is still draining, the new "
                          "one starts when it exits", pid);
            return NGX_OK;
        }
    }

    (void) ngx_omni_engine_spawn(cycle, oecf);

    return NGX_OK;
}


/*
 * Runs in the cache manager process (as the worker user) every
 * omni_engine_check_interval; the returned value is the next delay.
 */

static ngx_msec_t
ngx_omni_engine_manager(void *data)
{
    ngx_omni_engine_conf_t *oecf = data;

    ngx_pid_t     pid;
    ngx_cycle_t  *cycle;

    cycle = (ngx_cycle_t *) ngx_cycle;

    pid = ngx_omni_engine_holder(oecf);

    if (pid > 0) {
        oecf->seen = pid;
        return oecf->interval;
    }

    /*
     * A reload that changed the command line records the new one first:
     * the old cycle's cache manager, still running for a moment, must not
     * start the old command line again.
     */

    if (!ngx_omni_engine_recorded(cycle, oecf)) {
        ngx_log_debug0(NGX_LOG_DEBUG_CORE, cycle->log, 0,
                       "omni engine: command line changed, left to the "
                       "new cache manager");
        return oecf->interval;
    }

    if (oecf->started
        && ngx_current_msec - oecf->started < NGX_OMNI_ENGINE_FAST_FAIL)
    {
        oecf->backoff = ngx_min(ngx_max(oecf->backoff * 2, oecf->interval),
                                NGX_OMNI_ENGINE_MAX_BACKOFF);

    } else {
        oecf->backoff = oecf->interval;
    }

    if (oecf->seen) {
        ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                      "omni engine (pid %P) exited, respawning "
                      "(its output is in \"%s\")",
                      oecf->seen, oecf->log_file);

    } else {
        ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                      "omni engine not running, starting it");
    }

    oecf->seen = ngx_omni_engine_spawn(cycle, oecf);
    oecf->started = ngx_current_msec;

    return oecf->backoff;
}


static void
ngx_omni_engine_exit_master(ngx_cycle_t *cycle)
{
    ngx_pid_t                pid;
    ngx_omni_engine_conf_t  *oecf;

    oecf = (ngx_omni_engine_conf_t *) ngx_get_conf(cycle->conf_ctx,
                                                   ngx_omni_engine_module);

    if (oecf == NULL || oecf->args == NULL) {
        return;
    }

    pid = ngx_omni_engine_holder(oecf);

    if (pid <= 0) {
        return;
    }

    /* a binary upgrade: the new master keeps the engine */

    if (ngx_new_binary > 0 && kill(ngx_new_binary, 0) == 0) {
        ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                      "omni engine (pid %P) left to the new binary %P",
                      pid, ngx_new_binary);
        return;
    }

    ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                  "stopping omni engine (pid %P)", pid);

    if (kill(pid, SIGTERM) == -1) {
        ngx_log_error(NGX_LOG_ALERT, cycle->log, ngx_errno,
                      "kill(%P, SIGTERM) failed", pid);
        return;
    }

    pid = ngx_omni_engine_wait(oecf, 0, NGX_OMNI_ENGINE_EXIT_WAIT);

    if (pid > 0) {
        ngx_log_error(NGX_LOG_WARN, cycle->log, 0,
                      "omni engine (pid %P) still running after %M ms",
                      pid, (ngx_msec_t) NGX_OMNI_ENGINE_EXIT_WAIT);
    }
}


/* the pid of the process holding the engine's lock, 0 if none */

static ngx_pid_t
ngx_omni_engine_holder(ngx_omni_engine_conf_t *oecf)
{
    ngx_fd_t      fd;
    struct flock  fl;

    fd = ngx_open_file(oecf->lock_file,
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


/* polls until the lock is held (held = 1) or free (held = 0) */

static ngx_pid_t
ngx_omni_engine_wait(ngx_omni_engine_conf_t *oecf, ngx_uint_t held,
    ngx_msec_t ms)
{
    ngx_pid_t   pid;
    ngx_uint_t  i;

    for (i = 0; /* void */ ; i++) {

        pid = ngx_omni_engine_holder(oecf);

        if ((pid > 0) == (held != 0) || i * 10 >= ms) {
            return pid;
        }

        ngx_msleep(10);
    }
}


/*
 * Whether engine.cmd holds this configuration's command line, in the
 * format of /proc/PID/cmdline.  A missing or unreadable file counts as a
 * different command line.
 */

static ngx_int_t
ngx_omni_engine_recorded(ngx_cycle_t *cycle, ngx_omni_engine_conf_t *oecf)
{
    u_char     *buf;
    ssize_t     n;
    ngx_fd_t    fd;
    ngx_int_t   same;

    fd = ngx_open_file(oecf->cmd_file,
                       NGX_FILE_RDONLY|NGX_FILE_NONBLOCK|NGX_FILE_NOFOLLOW,
                       NGX_FILE_OPEN, 0);
    if (fd == NGX_INVALID_FILE) {
        return 0;
    }

    buf = ngx_alloc(oecf->cmdline.len + 1, cycle->log);
    if (buf == NULL) {
        (void) ngx_close_file(fd);
        return 0;
    }

    n = ngx_read_fd(fd, buf, oecf->cmdline.len + 1);

    same = (n == (ssize_t) oecf->cmdline.len
            && ngx_memcmp(buf, oecf->cmdline.data, n) == 0);

    ngx_free(buf);
    (void) ngx_close_file(fd);

    return same;
}


/*
 * Writes engine.cmd through a rename, so that readers never see half of
 * it.  The master may be root and the directory the worker user's: the
 * temporary file is created anew (O_EXCL), never opened through a link
 * someone else put there.
 */

static void
ngx_omni_engine_record(ngx_cycle_t *cycle, ngx_omni_engine_conf_t *oecf)
{
    ssize_t   n;
    ngx_fd_t  fd;

    if (ngx_delete_file(oecf->cmd_temp) == NGX_FILE_ERROR
        && ngx_errno != NGX_ENOENT)
    {
        ngx_log_error(NGX_LOG_ALERT, cycle->log, ngx_errno,
                      ngx_delete_file_n " \"%s\" failed", oecf->cmd_temp);
        return;
    }

    fd = ngx_open_file(oecf->cmd_temp, NGX_FILE_WRONLY,
                       NGX_FILE_CREATE_OR_OPEN|O_EXCL,
                       NGX_FILE_DEFAULT_ACCESS);
    if (fd == NGX_INVALID_FILE) {
        ngx_log_error(NGX_LOG_ALERT, cycle->log, ngx_errno,
                      ngx_open_file_n " \"%s\" failed", oecf->cmd_temp);
        return;
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
 * Starts the engine, detached (double fork), and waits briefly for it to
 * take its lock.  Returns the lock holder's pid, 0 if none yet.
 */

static ngx_pid_t
ngx_omni_engine_spawn(ngx_cycle_t *cycle, ngx_omni_engine_conf_t *oecf)
{
    int         status;
    char      **env;
    ngx_pid_t   pid;
    sigset_t    set, old;
    ngx_uint_t  n;

    /* the environment of nginx's workers: TZ and the "env" directives */

    n = 0;
    env = ngx_set_environment(cycle, &n);
    if (env == NULL) {
        return 0;
    }

    /* nginx's SIGCHLD handler must not reap the intermediate child */

    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigprocmask(SIG_BLOCK, &set, &old);

    pid = fork();

    if (pid == 0) {
        (void) setsid();

        if (fork() == 0) {
            ngx_omni_engine_exec(cycle, oecf, env);
        }

        _exit(0);
    }

    if (pid == -1) {
        ngx_log_error(NGX_LOG_ALERT, cycle->log, ngx_errno,
                      "fork() failed while starting omni engine");

    } else {
        while (waitpid(pid, &status, 0) == -1 && ngx_errno == NGX_EINTR) {
            /* void */
        }
    }

    sigprocmask(SIG_SETMASK, &old, NULL);
    ngx_free(env);

    if (pid == -1) {
        return 0;
    }

    pid = ngx_omni_engine_wait(oecf, 1, NGX_OMNI_ENGINE_START_WAIT);

    if (pid > 0) {
        ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                      "omni engine started (pid %P): \"%s\"",
                      pid, oecf->argv[0]);

    } else {
        ngx_log_error(NGX_LOG_ERR, cycle->log, 0,
                      "omni engine \"%s\" did not start, see \"%s\"",
                      oecf->argv[0], oecf->log_file);
    }

    return pid;
}


/* the grandchild: becomes the engine or exits */

static void
ngx_omni_engine_exec(ngx_cycle_t *cycle, ngx_omni_engine_conf_t *oecf,
    char **env)
{
    int               i;
    ngx_fd_t          fd;
    sigset_t          set;
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

    /* after the user switch: the file belongs to the engine's user */

    fd = open((char *) oecf->log_file, O_WRONLY|O_APPEND|O_CREAT, 0640);
    if (fd != -1) {
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
