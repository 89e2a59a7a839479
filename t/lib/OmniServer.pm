# t::lib::OmniServer -- nginx with ngx_omni_module in front of one
# `omni-engine serve`, started and stopped by a test or a benchmark that
# talks to it with its own clients (t/e2e/*.t, bench/nginx).
#
#   use lib '.';
#   use t::lib::OmniServer;
#   my $s = omni_server_start(engine_args => [...], workers => 1,
#                             worker_connections => 1024, api_keys => [...],
#                             http => '...extra http{} text...',
#                             server => '...extra server{} text...');
#   ... talk to "http://127.0.0.1:$s->{port}/v1/" ...
#   omni_server_stop($s);      # also done at END
#
# The engine runs on a socket under a temporary directory (proto.pl's
# serve_start); nginx runs as its own master (daemon off) from a private
# prefix under build/t/<name>/ with the config written there; its error
# log is $s->{prefix}/logs/error.log.
package t::lib::OmniServer;

use strict;
use warnings;

use Cwd qw(getcwd);
use Exporter 'import';
use File::Basename qw(basename);
use File::Path qw(make_path remove_tree);
use IO::Socket::INET;
use POSIX qw(WNOHANG);
use Time::HiRes qw(time sleep);
use t::lib::Proc qw(free_port);

# proto.pl's helpers go into main, as for the engine tests
{ package main; require './t/engine/proto.pl'; }

our @EXPORT = qw(omni_server_start omni_server_stop omni_server_reload
                 free_port nginx_worker_pids rss_kb http_get nginx_metrics);

our $NGINX = $ENV{TEST_NGINX_BINARY} // '/usr/sbin/nginx';
our $MODULE = getcwd() . '/build/ngx_omni_module.so';
my @servers;
my $pid0 = $$;

# The config: one server on 127.0.0.1:port; /v1/ goes to the engine,
# /health and /metrics are the module's handlers.
sub render_conf {
    my ($o) = @_;
    my $keys = $o->{api_keys_file}
               ? "        omni_api_keys $o->{api_keys_file};\n" : '';
    my $user = $> == 0 ? "user root;\n" : '';
    return <<"CONF";
# written by t/lib/OmniServer.pm
load_module $MODULE;
$user
daemon off;
master_process on;
worker_processes $o->{workers};
error_log logs/error.log $o->{log_level};
pid logs/nginx.pid;

events {
    worker_connections $o->{worker_connections};
}

http {
    access_log off;
    client_body_temp_path tmp/body;
    proxy_temp_path       tmp/proxy;
    fastcgi_temp_path     tmp/fastcgi;
    uwsgi_temp_path       tmp/uwsgi;
    scgi_temp_path        tmp/scgi;
$o->{http}
    server {
        listen 127.0.0.1:$o->{port};

        location /v1/ {
            omni_pass unix:$o->{socket};
$keys        }
        location = /health {
            omni_health;
            omni_pass unix:$o->{socket};
        }
        location = /metrics {
            omni_metrics;
            omni_pass unix:$o->{socket};
        }
$o->{server}
    }
}
CONF
}

sub omni_server_start {
    my (%o) = @_;
    die "$NGINX is missing (make test-deps)\n" unless -x $NGINX;
    die "$MODULE is not built\n" unless -f $MODULE;
    (my $name = $o{name} // basename($0)) =~ s/\.t$//;
    my $s = { port => $o{port} // free_port(),
              prefix => getcwd() . "/build/t/$name" };
    $s->{engine} = main::serve_start(args => $o{engine_args} // [],
                                     timeout => 60)
        unless $o{socket};
    $s->{socket} = $o{socket} // $s->{engine}{socket};
    remove_tree($s->{prefix});
    make_path(map { "$s->{prefix}/$_" } qw(conf logs tmp));
    my $keys_file;
    if ($o{api_keys}) {
        $keys_file = "$s->{prefix}/conf/api_keys";
        open(my $fh, '>', $keys_file) or die "$keys_file: $!\n";
        print $fh "$_\n" for @{ $o{api_keys} };
        close $fh;
    }
    my $conf = render_conf({ %o, port => $s->{port}, socket => $s->{socket},
                             workers => $o{workers} // 1,
                             worker_connections =>
                                 $o{worker_connections} // 1024,
                             log_level => $o{log_level} // 'info',
                             api_keys_file => $keys_file,
                             http => $o{http} // '',
                             server => $o{server} // '' });
    open(my $fh, '>', "$s->{prefix}/conf/nginx.conf") or die $!;
    print $fh $conf;
    close $fh;

    my $out = "$s->{prefix}/logs/stdout.log";
    my $pid = fork() // die "fork: $!";
    if ($pid == 0) {
        open(STDOUT, '>', $out) or die;
        open(STDERR, '>&', \*STDOUT) or die;
        exec($NGINX, '-p', $s->{prefix}, '-c', 'conf/nginx.conf')
            or exit 127;
    }
    $s->{pid} = $pid;
    push @servers, $s;
    my $until = time + 20;
    while (time < $until) {
        if (waitpid($pid, WNOHANG) == $pid) {
            $s->{pid} = undef;
            die "nginx exited at start:\n" . main::slurp($out)
                . main::slurp("$s->{prefix}/logs/error.log");
        }
        my $c = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$s->{port}");
        if ($c) {
            close $c;
            return $s;
        }
        sleep 0.05;
    }
    omni_server_stop($s);
    die "nginx did not listen on $s->{port}\n";
}

# SIGHUP; waits until the old workers are gone.
sub omni_server_reload {
    my ($s) = @_;
    my @old = nginx_worker_pids($s);
    kill 'HUP', $s->{pid};
    my $until = time + 10;
    while (time < $until) {
        last unless grep { kill 0, $_ } @old;
        sleep 0.05;
    }
}

sub omni_server_stop {
    my ($s) = @_;
    if ($s->{pid}) {
        kill 'QUIT', $s->{pid};
        my $until = time + 15;
        while (time < $until) {
            last if waitpid($s->{pid}, WNOHANG) == $s->{pid};
            sleep 0.05;
        }
        if (kill 0, $s->{pid}) {
            kill 'KILL', $s->{pid};
            waitpid($s->{pid}, 0);
        }
        $s->{pid} = undef;
    }
    if ($s->{engine}) {
        main::serve_stop($s->{engine}, 15);
        $s->{engine} = undef;
    }
}

# The worker processes of the nginx master.
sub nginx_worker_pids {
    my ($s) = @_;
    return () unless $s->{pid};
    my @pids;
    if (open(my $fh, '<', "/proc/$s->{pid}/task/$s->{pid}/children")) {
        @pids = split ' ', (<$fh> // '');
    }
    return grep {
        my $cmd = main::slurp("/proc/$_/cmdline");
        $cmd =~ /worker process/;
    } @pids;
}

# Resident memory of a process in kB (VmRSS).
sub rss_kb {
    my ($pid) = @_;
    my ($kb) = main::slurp("/proc/$pid/status") =~ /^VmRSS:\s+(\d+)/m;
    return $kb // 0;
}

# The server's /metrics as { 'name' or 'name{labels}' => value }.
sub nginx_metrics {
    my ($s) = @_;
    my (undef, undef, $body) = http_get($s, '/metrics');
    my %m;
    $m{$1} = $2 while ($body // '') =~ /^([a-z_]+(?:\{[^}]*\})?) (\S+)$/mg;
    return \%m;
}

# A small blocking HTTP/1.1 GET: returns (status, headers text, body).
sub http_get {
    my ($s, $path, %o) = @_;
    my $c = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$s->{port}",
                                  Timeout => 10) or return ();
    my $hdr = join '', map { "$_: $o{headers}{$_}\r\n" }
                       sort keys %{ $o{headers} // {} };
    print $c "GET $path HTTP/1.1\r\nHost: 127.0.0.1\r\n${hdr}"
             . "Connection: close\r\n\r\n";
    local $/;
    my $resp = <$c> // '';
    close $c;
    my ($head, $body) = split /\r\n\r\n/, $resp, 2;
    my ($status) = ($head // '') =~ m{^HTTP/1\.\d (\d+)};
    if (($head // '') =~ /^Transfer-Encoding: chunked/mi) {
        my $out = '';
        while ($body =~ s/^([0-9a-fA-F]+)\r\n//) {
            my $n = hex $1;
            last if $n == 0;
            $out .= substr($body, 0, $n, '');
            $body =~ s/^\r\n//;
        }
        $body = $out;
    }
    return ($status, $head, $body);
}

# A test killed by SIGTERM or SIGINT (a timeout, Ctrl-C) still stops what
# it started: exit runs the END blocks.
$SIG{$_} = sub { exit 1 } for qw(TERM INT);

END {
    if ($$ == $pid0) {
        omni_server_stop($_) for @servers;
    }
}

1;
