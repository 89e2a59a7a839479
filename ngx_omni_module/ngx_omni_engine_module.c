
/*
 * Copyright (C) ngx_omni authors
 */


/*
 * The omni_engine directive: nginx's master starts omni-engine, keeps it
 * across reloads, replaces it without an outage when a reload changes its
 * command line, restarts it when it dies and stops it on exit.
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
 *  - Supervision: the state directory is registered as an ngx_path_t with
 *    a manager callback, which makes the master run its "cache manager
 *    process" (itself respawned if it dies and restarted on reload); it
 *    calls ngx_omni_engine_manager() every omni_engine_check_interval, and
 *    that is where engines are started, watched and replaced.  Nothing
 *    there waits: each call looks at the lock files and returns.  The
 *    master only records the configured command line (init_module) and
 *    stops the engines on exit; the workers know nothing of all this.
 *    The cache manager exists only with "master_process on"; without it,
 *    init_module starts an engine once.
 *
 *  - Replacement: the engine's command line is what decides.  A reload
 *    writes the configured one to <state_dir>/engine.cmd, in the format of
 *    /proc/PID/cmdline; the live engine is kept while its
 *    /proc/PID/cmdline is that.  Otherwise a new engine is started with
 *    the same --lock-file and --replace (nginx always passes both): it
 *    finds the lock held, starts beside the live engine on <socket>.next,
 *    locks <state_dir>/engine.lock.next, and once ready renames both over
 *    the public names and sends the old engine SIGTERM (engine/frontend/frontend.c
 *    does all of that, so omni_pass never changes and no connect() ever
 *    finds the socket missing).  The cache manager watches: a new engine
 *    that holds engine.lock has taken over; one that dies first, or is not
 *    ready within omni_engine_start_timeout, is logged (with the last line
 *    of engine.log), stopped, and the old engine keeps serving until the
 *    next reload.  A new engine left by an earlier cache manager (a reload
 *    during a replacement) is adopted when it runs the configured command
 *    line and stopped when it does not.
 *
 *  - Spawn: double fork and setsid, so no nginx process has to reap the
 *    engine and no terminal signal reaches it; the middle process reports
 *    the engine's pid through a pipe.  In the engine, before execve: the
 *    signal mask emptied and dispositions reset (the master blocks HUP,
 *    TERM, CHLD... and ignores PIPE, and both survive execve), every
 *    descriptor from 3 up closed (listening sockets and logs are not
 *    close-on-exec), the worker user when nginx runs as root, umask 007,
 *    the prefix as working directory, stdout and stderr to
 *    <state_dir>/engine.log (0640 at most), and the environment nginx
 *    gives its workers.
 *
 *  - Stop: exit_master sends SIGTERM to the holders of engine.lock and
 *    engine.lock.next and waits a little for both to go.  An engine that
 *    was replaced is draining already and exits when its streams end.
 */


#include <ngx_config.h>
#include <ngx_core.h>

#include <grp.h>


#define NGX_OMNI_ENGINE_KILL_WAIT    10000    /* ms from SIGTERM to SIGKILL
                                                 for a new engine given up */
#define NGX_OMNI_ENGINE_EXIT_WAIT    5000     /* ms when nginx exits */
#define NGX_OMNI_ENGINE_FAST_FAIL    10000    /* died this soon: back off */
#define NGX_OMNI_ENGINE_MAX_BACKOFF  60000
#define NGX_OMNI_ENGINE_LOG_TAIL     2048     /* bytes of engine.log read
                                                 for its last line */


typedef struct {
    ngx_array_t      *args;         /* of ngx_str_t, the directive's */
    ngx_str_t         state_dir;
    ngx_msec_t        interval;
    ngx_msec_t        start_timeout;

    char            **argv;         /* args, "--lock-file", lock_file,
                                       "--replace", NULL; argv[0] is a
                                       full path */
    ngx_str_t         cmdline;      /* argv, each followed by NUL: the
                                       contents of engine.cmd and the
                                       /proc/PID/cmdline of an engine
                                       started from this configuration */
    u_char           *prefix;       /* the engine's working directory */
    u_char           *lock_file;    /* NUL-terminated, as the five below */
    u_char           *lock_next;    /* a new engine's lock until it takes
                                       over: lock_file + ".next" */
    u_char           *log_file;
    u_char           *cmd_file;
    u_char           *cmd_temp;

    /* the cache manager process's own state */
    ngx_pid_t         live;         /* the engine found at the last check */
    ngx_pid_t         spawned;      /* started (or adopted), not live yet */
    ngx_pid_t         replacing;    /* the live engine it is to replace,
                                       0 for a plain start */
    ngx_pid_t         stopping;     /* given up on, sent SIGTERM (SIGUSR2
                                       while a candidate) */
    ngx_uint_t        stopping_candidate;
    ngx_msec_t        started;      /* when "spawned" started */
    ngx_msec_t        stop_at;      /* SIGKILL for "stopping" then */
    ngx_msec_t        retry_at;     /* no plain start before */
    ngx_msec_t        backoff;
    off_t             log_size;     /* engine.log's size at the start */
    ngx_uint_t        failed;       /* a replacement by this command line
                                       failed: wait for the next reload */
    ngx_uint_t        unreadable;   /* engine.cmd could not be read (said
                                       once) */
} ngx_omni_engine_conf_t;


static void *ngx_omni_engine_create_conf(ngx_cycle_t *cycle);
static char *ngx_omni_engine_init_conf(ngx_cycle_t *cycle, void *conf);
static char *ngx_omni_engine(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);
static ngx_int_t ngx_omni_engine_init_module(ngx_cycle_t *cycle);
static void ngx_omni_engine_exit_master(ngx_cycle_t *cycle);
static ngx_msec_t ngx_omni_engine_manager(void *data);
static void ngx_omni_engine_watch(ngx_cycle_t *cycle,
    ngx_omni_engine_conf_t *oecf, ngx_pid_t live);
static void ngx_omni_engine_respawn(ngx_cycle_t *cycle,
    ngx_omni_engine_conf_t *oecf);
static void ngx_omni_engine_converge(ngx_cycle_t *cycle,
    ngx_omni_engine_conf_t *oecf, ngx_pid_t live);
static void ngx_omni_engine_adopt(ngx_cycle_t *cycle,
    ngx_omni_engine_conf_t *oecf, ngx_pid_t pid, ngx_pid_t live);
static void ngx_omni_engine_stop(ngx_cycle_t *cycle,
    ngx_omni_engine_conf_t *oecf, ngx_pid_t pid, ngx_uint_t candidate);
static void ngx_omni_engine_reap(ngx_cycle_t *cycle,
    ngx_omni_engine_conf_t *oecf);
static ngx_int_t ngx_omni_engine_build(ngx_cycle_t *cycle,
    ngx_omni_engine_conf_t *oecf);
static ngx_int_t ngx_omni_engine_add_path(ngx_cycle_t *cycle,
    ngx_omni_engine_conf_t *oecf);
static void ngx_omni_engine_private(ngx_cycle_t *cycle,
    ngx_omni_engine_conf_t *oecf);
static ngx_pid_t ngx_omni_engine_holder(u_char *lock_file);
static ngx_uint_t ngx_omni_engine_locked(ngx_omni_engine_conf_t *oecf,
    ngx_pid_t pid);
static ngx_uint_t ngx_omni_engine_alive(ngx_pid_t pid);
static ngx_int_t ngx_omni_engine_compare(ngx_cycle_t *cycle,
    ngx_omni_engine_conf_t *oecf, u_char *file);
static ngx_uint_t ngx_omni_engine_recorded(ngx_cycle_t *cycle,
    ngx_omni_engine_conf_t *oecf);
static ngx_uint_t ngx_omni_engine_runs(ngx_cycle_t *cycle,
    ngx_omni_engine_conf_t *oecf, ngx_pid_t pid);
static void ngx_omni_engine_record(ngx_cycle_t *cycle,
    ngx_omni_engine_conf_t *oecf);
static void ngx_omni_engine_last_line(ngx_omni_engine_conf_t *oecf,
    u_char *buf, size_t size, ngx_str_t *line);
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

    { ngx_string("omni_engine_start_timeout"),
      NGX_MAIN_CONF|NGX_DIRECT_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      0,
      offsetof(ngx_omni_engine_conf_t, start_timeout),
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
     *     oecf->live = 0;
     *     oecf->spawned = 0;
     *     oecf->replacing = 0;
     *     oecf->stopping = 0;
     *     oecf->stopping_candidate = 0;
     *     oecf->started = 0;
     *     oecf->retry_at = 0;
     *     oecf->backoff = 0;
     *     oecf->failed = 0;
     *     oecf->unreadable = 0;
     */

    oecf->interval = NGX_CONF_UNSET_MSEC;
    oecf->start_timeout = NGX_CONF_UNSET_MSEC;

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

        if (ngx_strcmp(value[i].data, "--lock-file") == 0
            || ngx_strcmp(value[i].data, "--replace") == 0)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"%V\" is set by nginx: the lock file is "
                               "omni_engine_state_dir/engine.lock, and "
                               "every engine it starts may replace the "
                               "one before", &value[i]);
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
    ngx_conf_init_msec_value(oecf->start_timeout, 120000);

    if (oecf->state_dir.data == NULL) {
        ngx_str_set(&oecf->state_dir, "omni");
    }

    if (oecf->args == NULL) {
        return NGX_CONF_OK;         /* loaded, not used */
    }

    if (oecf->interval == 0 || oecf->start_timeout == 0) {
        ngx_log_error(NGX_LOG_EMERG, cycle->log, 0,
                      "\"%s\" must be more than 0",
                      oecf->interval == 0 ? "omni_engine_check_interval"
                                          : "omni_engine_start_timeout");
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

    len = oecf->state_dir.len + sizeof("/engine.lock.next");

    oecf->lock_file = ngx_pnalloc(cycle->pool, len);
    oecf->lock_next = ngx_pnalloc(cycle->pool, len);
    oecf->log_file = ngx_pnalloc(cycle->pool, len);
    oecf->cmd_file = ngx_pnalloc(cycle->pool, len);
    oecf->cmd_temp = ngx_pnalloc(cycle->pool, len);
    oecf->prefix = ngx_pnalloc(cycle->pool, cycle->prefix.len + 1);

    if (oecf->lock_file == NULL || oecf->lock_next == NULL
        || oecf->log_file == NULL
        || oecf->cmd_file == NULL || oecf->cmd_temp == NULL
        || oecf->prefix == NULL)
    {
        return NGX_ERROR;
    }

    ngx_sprintf(oecf->lock_file, "%V/engine.lock%Z", &oecf->state_dir);
    ngx_sprintf(oecf->lock_next, "%V/engine.lock.next%Z", &oecf->state_dir);
    ngx_sprintf(oecf->log_file, "%V/engine.log%Z", &oecf->state_dir);
    ngx_sprintf(oecf->cmd_file, "%V/engine.cmd%Z", &oecf->state_dir);
    ngx_sprintf(oecf->cmd_temp, "%V/engine.cmd.tmp%Z", &oecf->state_dir);
    ngx_sprintf(oecf->prefix, "%V%Z", &cycle->prefix);

    n = oecf->args->nelts;
    arg = oecf->args->elts;

    oecf->argv = ngx_palloc(cycle->pool, (n + 4) * sizeof(char *));
    if (oecf->argv == NULL) {
        return NGX_ERROR;
    }

    for (i = 0; i < n; i++) {
        oecf->argv[i] = (char *) arg[i].data;
    }

    oecf->argv[n] = "--lock-file";
    oecf->argv[n + 1] = (char *) oecf->lock_file;
    oecf->argv[n + 2] = "--replace";
    oecf->argv[n + 3] = NULL;

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
 * It decides nothing that takes time: the cache manager does the work.
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

    ngx_omni_engine_private(cycle, oecf);
    ngx_omni_engine_record(cycle, oecf);

    pid = ngx_omni_engine_holder(oecf->lock_file);
    same = (pid > 0 && ngx_omni_engine_runs(cycle, oecf, pid));

    if (same) {
        ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                      "omni engine (pid %P) already running, kept", pid);

    } else if (pid > 0) {
        ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                      "omni engine command line changed: a new engine "
                      "starts beside pid %P and takes its place once ready",
                      pid);
    }

    ccf = (ngx_core_conf_t *) ngx_get_conf(cycle->conf_ctx, ngx_core_module);

    if (ccf->master) {
        return NGX_OK;
    }

    ngx_log_error(NGX_LOG_WARN, cycle->log, 0,
                  "omni_engine with \"master_process off\": the engine "
                  "is started but not restarted if it dies");

    if (!same) {
        pid = ngx_omni_engine_spawn(cycle, oecf);

        if (pid > 0) {
            ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                          "omni engine started (pid %P): \"%s\"",
                          pid, oecf->argv[0]);
        }
    }

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

    ngx_pid_t     live;
    ngx_cycle_t  *cycle;

    cycle = (ngx_cycle_t *) ngx_cycle;

    /*
     * A reload records its command line first: the old cycle's cache
     * manager, still running for a moment, leaves the engines to the new
     * one.
     */

    if (!ngx_omni_engine_recorded(cycle, oecf)) {
        ngx_log_debug0(NGX_LOG_DEBUG_CORE, cycle->log, 0,
                       "omni engine: command line changed, left to the "
                       "new cache manager");

        /* a replacement of ours is for a command line nobody wants now */

        if (oecf->spawned && oecf->replacing) {
            ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                          "omni engine (pid %P) was started for another "
                          "command line, stopping it", oecf->spawned);
            ngx_omni_engine_stop(cycle, oecf, oecf->spawned, 1);
            oecf->spawned = 0;
        }

        return oecf->interval;
    }

    if (oecf->stopping) {
        ngx_omni_engine_reap(cycle, oecf);
    }

    live = ngx_omni_engine_holder(oecf->lock_file);

    if (oecf->spawned) {
        ngx_omni_engine_watch(cycle, oecf, live);

    } else if (live == 0) {
        ngx_omni_engine_respawn(cycle, oecf);

    } else {
        oecf->live = live;
        ngx_omni_engine_converge(cycle, oecf, live);
    }

    return oecf->interval;
}


/*
 * An engine started here is live (done: it holds engine.lock), still
 * starting, dead, or late.  A replacement that fails leaves the old engine
 * serving and is not tried again before the next reload.
 */

static void
ngx_omni_engine_watch(ngx_cycle_t *cycle, ngx_omni_engine_conf_t *oecf,
    ngx_pid_t live)
{
    u_char      buf[NGX_OMNI_ENGINE_LOG_TAIL];
    ngx_str_t   line;
    ngx_pid_t   pid, old;
    ngx_uint_t  alive;

    pid = oecf->spawned;
    old = oecf->replacing;

    if (live == pid) {
        if (old) {
            ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                          "omni engine (pid %P) took the place of pid %P",
                          pid, old);
        }

        oecf->live = pid;
        oecf->spawned = 0;
        oecf->replacing = 0;
        return;
    }

    alive = ngx_omni_engine_alive(pid);

    if (alive && ngx_current_msec - oecf->started < oecf->start_timeout) {
        return;
    }

    /* it was live and exited before a check saw it: a respawn's business */

    if (!alive && ngx_omni_engine_locked(oecf, pid)) {
        oecf->live = pid;
        oecf->spawned = 0;
        oecf->replacing = 0;
        return;
    }

    oecf->spawned = 0;
    oecf->replacing = 0;

    /*
     * it found engine.lock.next held by a replacement an earlier cache
     * manager started: not a failure; the next check adopts or stops that
     * one, and then starts ours again
     */

    if (!alive && old && ngx_omni_engine_holder(oecf->lock_next) > 0) {
        ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                      "omni engine (pid %P) gave way to a replacement "
                      "already starting", pid);
        return;
    }

    ngx_omni_engine_last_line(oecf, buf, sizeof(buf), &line);

    if (alive && old) {
        ngx_log_error(NGX_LOG_ERR, cycle->log, 0,
                      "omni engine (pid %P) was not ready within %M ms, "
                      "stopping it; pid %P keeps serving; engine.log ends "
                      "with \"%V\"", pid, oecf->start_timeout, old, &line);

    } else if (alive) {
        ngx_log_error(NGX_LOG_ERR, cycle->log, 0,
                      "omni engine (pid %P) did not take its lock within "
                      "%M ms, stopping it; engine.log ends with \"%V\"",
                      pid, oecf->start_timeout, &line);

    } else if (old) {
        ngx_log_error(NGX_LOG_ERR, cycle->log, 0,
                      "omni engine (pid %P) exited before it was ready; "
                      "pid %P keeps serving; engine.log ends with \"%V\"",
                      pid, old, &line);

    } else {
        ngx_log_error(NGX_LOG_ERR, cycle->log, 0,
                      "omni engine \"%s\" did not start, see \"%s\": \"%V\"",
                      oecf->argv[0], oecf->log_file, &line);
    }

    if (alive) {
        ngx_omni_engine_stop(cycle, oecf, pid, old != 0);
    }

    if (old) {
        oecf->failed = 1;
    }
}


/* no engine holds engine.lock: one starting already, or a plain start */

static void
ngx_omni_engine_respawn(ngx_cycle_t *cycle, ngx_omni_engine_conf_t *oecf)
{
    ngx_pid_t  next;

    /*
     * a replacement started by an earlier cache manager whose old engine
     * went away: it takes over when it is ready
     */

    next = ngx_omni_engine_holder(oecf->lock_next);

    if (next > 0) {
        ngx_omni_engine_adopt(cycle, oecf, next, oecf->live);
        return;
    }

    if ((ngx_msec_int_t) (ngx_current_msec - oecf->retry_at) < 0) {
        return;
    }

    if (oecf->started
        && ngx_current_msec - oecf->started < NGX_OMNI_ENGINE_FAST_FAIL)
    {
        oecf->backoff = ngx_min(ngx_max(oecf->backoff * 2, oecf->interval),
                                NGX_OMNI_ENGINE_MAX_BACKOFF);

    } else {
        oecf->backoff = oecf->interval;
    }

    if (oecf->live) {
        ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                      "omni engine (pid %P) exited, respawning "
                      "(its output is in \"%s\")",
                      oecf->live, oecf->log_file);

    } else {
        ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                      "omni engine not running, starting it");
    }

    oecf->live = 0;
    oecf->started = ngx_current_msec;
    oecf->retry_at = ngx_current_msec + oecf->backoff;
    oecf->spawned = ngx_omni_engine_spawn(cycle, oecf);

    if (oecf->spawned) {
        ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                      "omni engine started (pid %P): \"%s\"",
                      oecf->spawned, oecf->argv[0]);
    }
}


/* an engine is live: replace it if it runs another command line */

static void
ngx_omni_engine_converge(ngx_cycle_t *cycle, ngx_omni_engine_conf_t *oecf,
    ngx_pid_t live)
{
    ngx_pid_t  next;

    next = ngx_omni_engine_holder(oecf->lock_next);

    if (next > 0) {
        ngx_omni_engine_adopt(cycle, oecf, next, live);
        return;
    }

    if (oecf->failed || ngx_omni_engine_runs(cycle, oecf, live)) {
        return;
    }

    oecf->started = ngx_current_msec;
    oecf->replacing = live;
    oecf->spawned = ngx_omni_engine_spawn(cycle, oecf);

    if (oecf->spawned) {
        ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                      "omni engine started (pid %P) beside pid %P, to take "
                      "its place once ready: \"%s\"",
                      oecf->spawned, live, oecf->argv[0]);
    }
}


/*
 * A new engine holding engine.lock.next that this process did not start:
 * an earlier cache manager's (a reload came during a replacement).  It is
 * watched as if started here when it runs this command line, and stopped
 * when it does not.  Its start time is when it wrote its pid into the lock
 * file.
 */

static void
ngx_omni_engine_adopt(ngx_cycle_t *cycle, ngx_omni_engine_conf_t *oecf,
    ngx_pid_t pid, ngx_pid_t live)
{
    time_t           age;
    ngx_file_info_t  fi;

    if (pid == oecf->stopping) {
        return;
    }

    if (!ngx_omni_engine_runs(cycle, oecf, pid)) {
        ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                      "omni engine (pid %P) was started for another "
                      "command line, stopping it", pid);
        ngx_omni_engine_stop(cycle, oecf, pid, 1);
        return;
    }

    age = 0;

    if (ngx_file_info(oecf->lock_next, &fi) != NGX_FILE_ERROR) {
        age = ngx_time() - ngx_file_mtime(&fi);
    }

    age = ngx_max(age, 0);

    oecf->spawned = pid;
    oecf->replacing = live;
    oecf->log_size = 0;
    oecf->started = ngx_current_msec
                    - ngx_min((ngx_msec_t) age * 1000, oecf->start_timeout);

    ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                  "omni engine (pid %P) is starting beside pid %P, "
                  "watching it", pid, live);
}


/*
 * A candidate (a replacement not yet live) gets SIGUSR2, which an engine
 * obeys only while it is one: it may take over between our last look at
 * engine.lock and this kill(), and SIGTERM would then stop the engine that
 * just became the only one serving.  The engine handles the signal and
 * its takeover in one loop, so either it gives up and never takes over,
 * or it took over first and ignores the signal (ngx_omni_engine_reap()
 * then sees it holding engine.lock and lets it be).
 */

static void
ngx_omni_engine_stop(ngx_cycle_t *cycle, ngx_omni_engine_conf_t *oecf,
    ngx_pid_t pid, ngx_uint_t candidate)
{
    int  sig;

    sig = candidate ? SIGUSR2 : SIGTERM;

    if (kill(pid, sig) == -1) {
        ngx_log_error(NGX_LOG_ALERT, cycle->log, ngx_errno,
                      "kill(%P, %s) failed", pid,
                      candidate ? "SIGUSR2" : "SIGTERM");
        return;
    }

    oecf->stopping = pid;
    oecf->stopping_candidate = candidate;
    oecf->stop_at = ngx_current_msec + NGX_OMNI_ENGINE_KILL_WAIT;
}


/* a stopped engine that outlives its grace period gets SIGKILL */

static void
ngx_omni_engine_reap(ngx_cycle_t *cycle, ngx_omni_engine_conf_t *oecf)
{
    if (!ngx_omni_engine_alive(oecf->stopping)) {
        oecf->stopping = 0;
        return;
    }

    if (oecf->stopping_candidate
        && ngx_omni_engine_holder(oecf->lock_file) == oecf->stopping)
    {
        ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                      "omni engine (pid %P) took over before it could be "
                      "stopped; it is the live engine now", oecf->stopping);
        oecf->stopping = 0;
        return;
    }

    if ((ngx_msec_int_t) (ngx_current_msec - oecf->stop_at) < 0) {
        return;
    }

    ngx_log_error(NGX_LOG_WARN, cycle->log, 0,
                  "omni engine (pid %P) still running %M ms after SIGTERM, "
                  "killing it", oecf->stopping,
                  (ngx_msec_t) NGX_OMNI_ENGINE_KILL_WAIT);

    if (kill(oecf->stopping, SIGKILL) == -1) {
        ngx_log_error(NGX_LOG_ALERT, cycle->log, ngx_errno,
                      "kill(%P, SIGKILL) failed", oecf->stopping);
    }

    oecf->stopping = 0;
}


/*
 * nginx exits: SIGTERM to the live engine and to a new one starting
 * beside it, and a short wait for both.  A new engine may take over (or
 * lock engine.lock.next) while we wait, so every holder seen is stopped.
 */

static void
ngx_omni_engine_exit_master(ngx_cycle_t *cycle)
{
    ngx_pid_t                pid[2], sent[8];
    ngx_uint_t               i, j, k, n;
    ngx_omni_engine_conf_t  *oecf;

    oecf = (ngx_omni_engine_conf_t *) ngx_get_conf(cycle->conf_ctx,
                                                   ngx_omni_engine_module);

    if (oecf == NULL || oecf->args == NULL) {
        return;
    }

    n = 0;

    for (i = 0; /* void */ ; i++) {

        pid[0] = ngx_omni_engine_holder(oecf->lock_file);
        pid[1] = ngx_omni_engine_holder(oecf->lock_next);

        if (pid[0] == 0 && pid[1] == 0) {
            return;
        }

        /* a binary upgrade: the new master keeps the engine */

        if (i == 0 && ngx_new_binary > 0 && kill(ngx_new_binary, 0) == 0) {
            ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                          "omni engine (pid %P) left to the new binary %P",
                          pid[0] ? pid[0] : pid[1], ngx_new_binary);
            return;
        }

        if (i * 10 >= NGX_OMNI_ENGINE_EXIT_WAIT) {
            ngx_log_error(NGX_LOG_WARN, cycle->log, 0,
                          "omni engine (pid %P) still running after %M ms",
                          pid[0] ? pid[0] : pid[1],
                          (ngx_msec_t) NGX_OMNI_ENGINE_EXIT_WAIT);
            return;
        }

        for (j = 0; j < 2; j++) {

            for (k = 0; k < n; k++) {
                if (sent[k] == pid[j]) {
                    break;
                }
            }

            if (pid[j] == 0 || k < n || n == 8) {
                continue;
            }

            ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                          "stopping omni engine (pid %P)", pid[j]);

            if (kill(pid[j], SIGTERM) == -1) {
                ngx_log_error(NGX_LOG_ALERT, cycle->log, ngx_errno,
                              "kill(%P, SIGTERM) failed", pid[j]);
            }

            sent[n++] = pid[j];
        }

        ngx_msleep(10);
    }
}


/*
 * The state directory holds the engine's lock and log, and usually its
 * socket: the engine's user has business there, its group perhaps (read
 * and search, if the directory allows it), nobody else.  nginx creates it
 * 0700 but leaves an existing directory's mode as it is.
 */

static void
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

static ngx_pid_t
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

static ngx_uint_t
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

static ngx_uint_t
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

static ngx_uint_t
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

static ngx_uint_t
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

static void
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
 * started (the tail of the file when that is unknown), for the error log:
 * usually why the engine failed ("... No such file or directory").  Two
 * engines share the file during a replacement, but a serving engine is
 * quiet, so the line is almost always the new one's.
 */

static void
ngx_omni_engine_last_line(ngx_omni_engine_conf_t *oecf, u_char *buf,
    size_t size, ngx_str_t *line)
{
    off_t             from;
    u_char           *p, *last;
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

    for (p = last; p > buf && p[-1] != LF; p--) { /* void */ }

    if (p < last) {
        line->data = p;
        line->len = last - p;
    }
}


/*
 * Starts the engine, detached (double fork).  Returns its pid, which the
 * middle process reports through a pipe, or 0.  Nothing waits for the
 * engine: the cache manager looks at its lock on the next checks.
 */

static ngx_pid_t
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
