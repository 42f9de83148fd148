"""Differential check against real bash: whatever bash runs, a deny rule on it sees or refuses.

Each snippet hides ``touch {M}`` in a corner of bash's syntax (here-documents, quoting,
comments, line continuations, nested backticks, reserved words, arithmetic ``<<``). Bash runs
it in a temporary directory; when the marker appears, ``deny = ["touch"]`` must deny the
snippet (by name, or because it cannot be read). Snippets bash does not run may pass.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from amplifier_tools.builtins.bash.rules import CommandRules
from amplifier_tools.errors import PolicyError

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
DENY = CommandRules(deny=("touch",))
SNIPPETS = [
    'cat <<EOF\nx\nEOF \ntouch {M}\nEOF',
    'cat <<-EOF\n\tx\n\tEOF\ntouch {M}',
    'cat <<"EOF"\n$(touch {M})\nEOF',
    'cat <<E"O"F\n$(touch {M})\nEOF',
    'cat <<\\EOF\n$(touch {M})\nEOF',
    'cat <<EOF; touch {M}\nx\nEOF',
    'cat <<A <<B\na\nA\nb\nB\ntouch {M}',
    "cat <<'A' <<B\n$(touch {M})\nA\nb\nB",
    'cat <<A\nA\ntouch {M}',
    'cat <<A\n A\ntouch {M}\nA',
    "echo '#'; touch {M}",
    'echo x#; touch {M}',
    'echo \\#; touch {M}',
    'echo "it\'s"; touch {M}',
    "echo $'it\\'s'; touch {M}",
    'case x in x) touch {M};; esac',
    'case x in (x) touch {M};; esac',
    'case x in y) ;; *) touch {M} ;; esac',
    'echo $(( 1 + 2 )); touch {M}',
    'echo $(case x in x) touch {M};; esac)',
    'echo `echo \\`touch {M}\\``',
    'echo "$(echo "`touch {M}`")"',
    'f() ( touch {M} ); f',
    'function f { touch {M}; }; f',
    'if [[ a == a ]]; then touch {M}; fi',
    '[[ a < b ]] && touch {M}',
    'x=(a b); touch {M}',
    'declare -A m=([a]=1); touch {M}',
    'echo ${x:-a}; touch {M}',
    'echo ${#x}; touch {M}',
    'echo {a,b}; touch {M}',
    'a=1 b=2 touch {M}',
    'echo x >| /dev/null; touch {M}',
    'echo x &>/dev/null; touch {M}',
    'echo x 2>&1 >/dev/null | touch {M}',
    'exec 2>/dev/null; touch {M}',
    ': $((x=1)); touch {M}',
    'time touch {M}',
    '! touch {M}',
    '{ touch {M}; }',
    '(touch {M})',
    'echo $((2#101)) && touch {M}',
    'for ((i=0;i<1;i++)); do touch {M}; done',
    'select x in a; do touch {M}; break; done <<< 1',
    'until touch {M}; do :; done',
    'while false; do :; done; touch {M}',
    'echo "a\\\nb"; touch {M}',
    'echo a \\\n; touch {M}',
    'touch\\\n {M}',
    't\\\nouch {M}',
    "echo ';' && touch {M}",
    'echo $"x"; touch {M}',
    'echo ~; touch {M}',
    "printf '%s\\n' a | while read l; do touch {M}; done",
    'echo $((16#ff)); touch {M}',
    'x=1; echo $((x)); touch {M}',
    'command -v ls >/dev/null && touch {M}',
    'echo x | tee /dev/null | touch {M}',
    'arr[0]=1; touch {M}',
    'echo ${arr[0]}; touch {M}',
    'coproc cat; touch {M}',
    'trap - EXIT; touch {M}',
    'echo $((1<<2)); touch {M}',
    'echo $[1<<2]\ntouch {M}',
    '((1<<2))\ntouch {M}',
    'x=$((1<<2)) touch {M}',
    "let 'x=1<<2'\ntouch {M}",
    'echo 1 <<<x; touch {M}',
    "cat <<< $'a\\nb'; touch {M}",
    'echo "$((1<<2))"\ntouch {M}',
    'echo ${x:-<<EOF}\ntouch {M}',
    "echo '<<EOF'\ntouch {M}",
    'echo "<<EOF"\ntouch {M}',
    'echo <<EOF x\nEOF\ntouch {M}',
    '# comment <<EOF\ntouch {M}',
    'echo $# <<EOF\nEOF\ntouch {M}',
    'echo ${x#<<}\ntouch {M}',
    'echo `echo <<EOF`\ntouch {M}',
    'cat << EOF\n`touch {M}`\nEOF',
    'echo $( cat <<EOF\nx\nEOF\n); touch {M}',
    "v=$(cat <<'EOF'\n)\nEOF\n); touch {M}",
    'echo x\\;touch {M}',
    'echo x;\\touch {M}',
    'echo x&&touch {M}',
    'echo x||touch {M}',
    'echo x|touch {M}',
    'echo x&touch {M}\nwait',
    'echo $(echo )touch {M}',
    '${x:-touch} {M}',
    '""touch {M}',
    "''touch {M}",
    "touch'' {M}",
    "to''uch {M}",
    '$@touch {M}',
    '$*touch {M}',
]


@pytest.mark.parametrize("snippet", SNIPPETS)
def test_a_command_bash_runs_is_seen_by_a_deny_rule(snippet: str, tmp_path: Path) -> None:
    command = snippet.replace("{M}", "marker")
    subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, timeout=30, check=False)
    if not (tmp_path / "marker").exists():
        return  # bash did not run it either
    with pytest.raises(PolicyError) as info:
        DENY.check(command)
    assert info.value.details["rule"] in ("deny:touch", "unreadable", "unparsable")
