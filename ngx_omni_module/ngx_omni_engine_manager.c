
/*
 * Copyright (C) ngx_omni authors
 */


/*
 * ngx_omni_engine_manager.c -- the engine's supervisor: the callback the
 * cache manager process runs every omni_engine_check_interval. It looks
 * at the lock files and decides: start an engine, wait for one starting,
 * replace one whose command line is not the configured one, give up on
 * one that failed, SIGKILL one that outlived its grace period. Nothing
 * here waits. Kept apart from the configuration (ngx_omni_engine_module.c)
 * and from the process primitives it uses (ngx_omni_engine_proc.c).
 */


#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_omni_engine_module.h"


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

/*
 * Runs in the cache manager process (as the worker user) every
 * omni_engine_check_interval; the returned value is the next delay.
 */

ngx_msec_t
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

