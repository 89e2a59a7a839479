// t/e2e/tap.js -- TAP for the e2e scripts (openai.js, speech.js): ok() and
// is() print "ok N - name" / "not ok N - name" (with what was got on a
// failure), run() runs the script's async main and ends the plan: exit 0
// when every check passed. The .t file that runs a script turns its lines
// into tests (t/lib/NodeTap.pm).
'use strict';

let n = 0, failed = 0;

function ok(cond, name, extra) {
    n++;
    if (!cond) failed++;
    console.log(`${cond ? 'ok' : 'not ok'} ${n} - ${name}`);
    if (!cond && extra !== undefined) {
        console.log('# ' + JSON.stringify(extra).slice(0, 2000));
    }
}

function is(got, want, name) {
    ok(got === want, name, { got, want });
}

function run(main) {
    main().then(() => {
        console.log(`1..${n}`);
        process.exit(failed ? 1 : 0);
    }, (err) => {
        ok(false, `unexpected exception: ${err && err.stack ? err.stack : err}`);
        console.log(`1..${n}`);
        process.exit(1);
    });
}

module.exports = { ok, is, run };
