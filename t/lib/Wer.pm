package Wer;

# Word error rate: the word-level edit distance (substitutions, deletions,
# insertions) between a reference and a hypothesis, over the reference's
# word count. Both are normalized first: lower case, apostrophes kept
# inside words ("don't"), every other non-letter a space, so punctuation
# and case never count as errors.
#
#   use Wer qw(wer words);
#   my $rate = wer("And so, my fellow Americans", "and so my fellow american");

use strict;
use warnings;
use Exporter qw(import);
use List::Util qw(min);

our @EXPORT_OK = qw(wer words edits);

sub words {
    my ($s) = @_;
    $s = lc($s // '');
    $s =~ s/<\/?s>|<sil>|\[\w+\]//g;        # recogniser markup, if any
    $s =~ s/[^a-z0-9']+/ /g;
    $s =~ s/(^|\s)'+|'+(\s|$)/ /g;          # quotes, not apostrophes
    return grep { length } split ' ', $s;
}

# Edit distance between two word lists.
sub edits {
    my ($ref, $hyp) = @_;
    my @prev = (0 .. @$hyp);
    for my $i (1 .. @$ref) {
        my @cur = ($i);
        for my $j (1 .. @$hyp) {
            my $sub = $prev[$j - 1] + ($ref->[$i - 1] eq $hyp->[$j - 1] ? 0 : 1);
            push @cur, min($sub, $prev[$j] + 1, $cur[$j - 1] + 1);
        }
        @prev = @cur;
    }
    return $prev[-1];
}

# WER of hyp against ref (strings); 0 for an empty ref and an empty hyp.
sub wer {
    my ($ref, $hyp) = @_;
    my @r = words($ref);
    my @h = words($hyp);
    return @h ? 1 : 0 unless @r;
    return edits(\@r, \@h) / @r;
}

1;
