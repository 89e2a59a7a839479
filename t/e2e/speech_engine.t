# t/e2e/speech.t against the real omni-engine (thinker, talker, voicebox):
# the openai npm package's audio.speech.create (raw and "sse") and chat
# audio, streamed and not, through nginx, on audio the engine synthesized.
use strict;
use warnings;
$ENV{OMNI_E2E_UPSTREAM} = 'engine';
my $rc = do './t/e2e/speech.t';
die $@ if $@;
