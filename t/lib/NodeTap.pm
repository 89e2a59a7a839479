# t::lib::NodeTap -- runs a node script of t/e2e/ (TAP out, t/e2e/tap.js)
# and turns its lines into this test's tests: "ok N - name" passes
# "$label: name", "# ..." and anything else is a diagnostic; then checks
# that it ran at least $min checks and exited 0.
#
#   use t::lib::NodeTap;
#   local $ENV{...} = ...;              # what the script reads
#   node_tap('t/e2e/speech.js', 'openai npm', 20);
package t::lib::NodeTap;
use strict;
use warnings;
use Exporter 'import';
use File::Basename qw(basename);
use Test::More;

our @EXPORT = qw(node_tap);

sub node_tap {
    my ($script, $label, $min) = @_;
    my @out = `node $script 2>&1`;
    my $rc = $? >> 8;
    my $n = 0;
    for (@out) {
        if (/^(not )?ok \d+ - (.*)$/) {
            ok(!$1, "$label: $2");
            $n++;
        } elsif (/^# (.*)/) {
            diag($1);
        } elsif (!/^1\.\.\d+$/) {
            diag($_);
        }
    }
    my $name = basename($script);
    ok($n >= $min, "$name ran its checks ($n)");
    is($rc, 0, "$name exit status");
}

1;
