
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
 *    the public names and sends the old engine SIGTERM
 *    (engine/frontend/frontend.c does all of that, so omni_pass never
 *    changes and no connect() ever finds the socket missing).  The cache
 *    manager watches: a new engine that holds engine.lock has taken over;
 *    one that dies first, or is not ready within
 *    omni_engine_start_timeout, is logged (with the last line of
 *    engine.log), stopped, and the old engine keeps serving until the
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
 *
 * Three files: this one holds the directives, the configuration and what
 * the master does (init_module, exit_master); ngx_omni_engine_manager.c
 * the cache manager's callback, the policy; ngx_omni_engine_proc.c the
 * primitives on one engine process (locks, command lines, log, spawn).
 */


#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_omni_engine_module.h"


static void *ngx_omni_engine_create_conf(ngx_cycle_t *cycle);
static char *ngx_omni_engine_init_conf(ngx_cycle_t *cycle, void *conf);
static char *ngx_omni_engine(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);
static ngx_int_t ngx_omni_engine_init_module(ngx_cycle_t *cycle);
static void ngx_omni_engine_exit_master(ngx_cycle_t *cycle);
static ngx_int_t ngx_omni_engine_build(ngx_cycle_t *cycle,
    ngx_omni_engine_conf_t *oecf);
static ngx_int_t ngx_omni_engine_add_path(ngx_cycle_t *cycle,
    ngx_omni_engine_conf_t *oecf);


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

