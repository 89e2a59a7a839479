# t::lib::Proc -- processes and locks, for the suites that start, replace
# and kill engines (t/omni_engine.t, t/reload.t, t/engine/replace.t).
#
#   lock_holder($path)      the pid holding a write lock on $path (fcntl,
#                           as `serve --lock-file` takes it), 0 if none
#   alive($pid)             it exists and is not a zombie
#   children($pid)          its child pids (/proc)
#   wait_for($s, $cond)     polls $cond every 20 ms for up to $s seconds;
#                           returns its last value
#   free_port()             a TCP port on 127.0.0.1 nothing listens on now
package t::lib::Proc;

use strict;
use warnings;
use Exporter 'import';
use Fcntl qw(F_GETLK F_WRLCK F_UNLCK SEEK_SET O_RDONLY);
use IO::Socket::INET;
use Time::HiRes qw(time sleep);

our @EXPORT_OK = qw(lock_holder alive children wait_for free_port);

sub lock_holder {
    my ($path) = @_;
    sysopen(my $fh, $path, O_RDONLY) or return 0;
    my $fl = pack('s s x4 q q i x4', F_WRLCK, SEEK_SET, 0, 0, 0);
    fcntl($fh, F_GETLK, $fl) or return 0;
    my ($type, undef, undef, undef, $pid) = unpack('s s x4 q q i x4', $fl);
    return $type == F_UNLCK ? 0 : $pid;
}

sub alive {
    my ($pid) = @_;
    open(my $fh, '<', "/proc/$pid/stat") or return 0;
    my $stat = <$fh> // '';
    return $stat !~ /^\d+ \(.*\) Z /s;
}

sub children {
    my ($pid) = @_;
    open(my $fh, '<', "/proc/$pid/task/$pid/children") or return ();
    return split ' ', (<$fh> // '');
}

sub wait_for {
    my ($timeout, $cond) = @_;
    my $until = time + $timeout;
    my $v;
    until (($v = $cond->()) || time > $until) {
        sleep 0.02;
    }
    return $v;
}

sub free_port {
    my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0,
                                  Listen => 1) or die "no free port: $!\n";
    my $p = $s->sockport;
    close $s;
    return $p;
}

1;
