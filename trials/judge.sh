#!/usr/bin/env bash
# Judge the queued kernel trials on a GPU machine: each trials/NAME.patch applied over HEAD, the commands of its
# `run:` lines run (attnbench ab --impl fused_triton --base HEAD …: the patched working tree against HEAD), the
# patch taken back. What each printed goes to OUT/NAME/log.txt (its last 25 lines echoed as "NAME| …"), and a
# summary to OUT/summary.txt, said again at the end.
#
#   bash trials/judge.sh [--out DIR] [--tar FILE] [--deadline-s S] [--commit-tree] [--editable] [--dry-run] [--list] [NAME …]
#
# --out DIR      where the results go (default runs/trials under the repository; a relative DIR is taken from
#                where you are); each run line sees OUT/NAME as $TRIAL_OUT
# --tar FILE     after each trial, OUT packed into FILE (.tar.gz, outside OUT): what a machine that returns few
#                files needs, and it holds every trial judged so far if the call is cut short; an earlier
#                call's results for the queued trials are cleared from OUT first
# --deadline-s S no run line starts once S seconds have passed, and one still running then is stopped (TERM,
#                KILL 5 s later; exit 124 or 137, its trial taken back); the trials after it are said as not
#                run: the call ends in time to return what it has
# --commit-tree  commit the working tree first (a GPU machine's copied tree, whose .git may lag its files):
#                without it a tree with changes is refused, since `ab --base HEAD` would judge them too
# --editable     where attnbench is imported from elsewhere (the GPU machine's setup.sh installs a copy), first
#                install this clone editable (pip, no index): `ab --base` needs the working tree's attnbench
# --dry-run      apply and take back each patch, print its run lines, run nothing
# --list         the queued trials, one line each
# NAME …         only these trials (default: all, in name order)
set -uo pipefail
export LC_ALL=C # the trials in byte order, as `--list` says them
here=$PWD
cd "$(dirname "$0")/.."

die() {
    echo "judge.sh: $*" >&2
    exit 2
}

out=$PWD/runs/trials
tarball=
deadline=0
commit_tree=0
editable=0
dry_run=0
list=0
names=()
while [ $# -gt 0 ]; do
    case "$1" in
    --out)
        [ $# -ge 2 ] || die "--out needs a folder"
        case "$2" in /*) out=$2 ;; *) out=$here/$2 ;; esac
        shift 2
        ;;
    --tar)
        [ $# -ge 2 ] || die "--tar needs a file"
        case "$2" in /*) tarball=$2 ;; *) tarball=$here/$2 ;; esac
        shift 2
        ;;
    --deadline-s)
        [ $# -ge 2 ] && [[ $2 =~ ^[1-9][0-9]{0,5}$ ]] || die "--deadline-s needs a whole number of seconds, 1 or more"
        deadline=$2
        shift 2
        ;;
    --commit-tree) commit_tree=1 && shift ;;
    --editable) editable=1 && shift ;;
    --dry-run) dry_run=1 && shift ;;
    --list) list=1 && shift ;;
    -h | --help)
        awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
        exit 0
        ;;
    -*) die "unknown option $1; allowed: --out DIR, --tar FILE, --deadline-s S, --commit-tree, --editable, --dry-run, --list, trial names" ;;
    *) names+=("$1") && shift ;;
    esac
done

out=$(realpath -m "$out") # one spelling of each path: a trailing /, ./ or .. can't hide the tarball inside OUT
if [ -n "$tarball" ]; then
    tarball=$(realpath -m "$tarball")
    case "$tarball/" in "$out"/*) die "--tar $tarball: the file must lie outside --out $out" ;; esac
    [ -d "$(dirname "$tarball")" ] || die "--tar $tarball: no folder $(dirname "$tarball")"
fi
started=$SECONDS
past_deadline() { [ "$deadline" -gt 0 ] && [ $((SECONDS - started)) -ge "$deadline" ]; }

queued=()
for patch in trials/*.patch; do
    [ -e "$patch" ] && queued+=("$(basename "$patch" .patch)")
done
[ ${#queued[@]} -gt 0 ] || die "no trials queued (trials/*.patch)"
if [ "$list" = 1 ]; then
    for name in "${queued[@]}"; do
        printf '%-28s %s\n' "$name" "$(sed -n 's/^Trial: //p' "trials/$name.patch" | head -1)"
    done
    exit 0
fi
if [ ${#names[@]} -eq 0 ]; then
    names=("${queued[@]}")
fi
for name in "${names[@]}"; do
    [ -f "trials/$name.patch" ] || die "no trial '$name'; queued: ${queued[*]}"
done

if [ -n "$(git status --porcelain)" ]; then
    if [ "$commit_tree" = 1 ]; then
        git add -A && git -c user.name=judge -c user.email=judge@localhost -c commit.gpgsign=false commit -qm "judge.sh: the tree as found" ||
            die "could not commit the tree"
    elif [ "$dry_run" = 0 ]; then
        die "the working tree has changes: ab --base HEAD would judge them too; commit them, or pass --commit-tree"
    fi
fi

# `ab --base HEAD` imports the working tree's attnbench from this clone: the GPU machine's setup.sh installs a
# copy into site-packages instead, and then every `ab` stops at "not in a git repository" (session 26's first call).
if [ "$editable" = 1 ] && [ "$dry_run" = 0 ]; then
    imported_from() { # the folder attnbench.impls comes from: this clone's root, or a copy's site-packages
        python3 -c "import pathlib, attnbench.impls as m; print(pathlib.Path(m.__file__).resolve().parents[1])" \
            2>/dev/null || echo "(attnbench does not import)"
    }
    if [ "$(imported_from)" != "$(realpath .)" ]; then
        echo "judge.sh: attnbench is imported from '$(imported_from)', not this clone: installing it editable" >&2
        log=$(mktemp)
        python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$log" 2>&1 ||
            die "pip install -e . failed: $(tail -3 "$log" | tr '\n' ' ')"
        [ "$(imported_from)" = "$(realpath .)" ] || die "attnbench is still imported from '$(imported_from)'"
    fi
fi

pack() { # OUT into the tarball, replaced whole (a cut-short call leaves the last one complete)
    [ -n "$tarball" ] && [ -d "$out" ] || return 0
    tar -czf "$tarball.part" -C "$(dirname "$out")" "$(basename "$out")" && mv -f "$tarball.part" "$tarball"
}

applied=
running=
take_back() {
    if [ -n "$running" ]; then # the run line's whole process group: the command and all it started
        kill -TERM -- -"$running" 2>/dev/null
        wait "$running" 2>/dev/null
        running=
    fi
    if [ -n "$applied" ]; then
        git apply -R "$applied" && echo "judge.sh: took $applied back" >&2
        applied=
    fi
    pack
}
trap take_back EXIT
trap 'take_back; exit 130' INT
trap 'take_back; exit 143' TERM

mkdir -p "$out"
for name in "${queued[@]}"; do # an earlier call's results (a warm machine): only this call's go in the tarball
    rm -rf "${out:?}/$name" "${out:?}/$name.apply.txt"
done
summary="$out/summary.txt"
: >"$summary"
failed=0
for name in "${names[@]}"; do
    patch="trials/$name.patch"
    if [ "$dry_run" = 0 ] && past_deadline; then
        echo "$name: not run: the deadline (${deadline} s) has passed" | tee -a "$summary"
        failed=1
        continue
    fi
    if ! git apply --check "$patch" 2>"$out/$name.apply.txt"; then
        echo "$name: does not apply to $(git rev-parse --short HEAD) ($(head -1 "$out/$name.apply.txt"))" | tee -a "$summary"
        failed=1
        continue
    fi
    rm -f "$out/$name.apply.txt"
    applied=$patch # taken back on the way out too (an interrupt); set first, so no moment goes unguarded
    git apply "$patch"
    export TRIAL_OUT="$out/$name"
    mkdir -p "$TRIAL_OUT"
    status=()
    while IFS= read -r line; do
        command=${line#run: }
        if [ "$dry_run" = 1 ]; then
            echo "$name: would run: $command"
            continue
        fi
        if past_deadline; then
            echo "$name: not run: the deadline (${deadline} s) has passed: $command" | tee -a "$TRIAL_OUT/log.txt"
            status+=(deadline)
            failed=1
            continue
        fi
        limit=()
        left=$((deadline - (SECONDS - started)))
        [ "$deadline" -gt 0 ] && limit=(timeout --kill-after=5 $((left > 0 ? left : 1))) # 0 would mean no limit
        echo "$name: $command" | tee -a "$TRIAL_OUT/log.txt"
        before=$(wc -c <"$TRIAL_OUT/log.txt")
        setsid ${limit[@]+"${limit[@]}"} bash -c "$command" >>"$TRIAL_OUT/log.txt" 2>&1 &
        running=$! # a process group of its own, waited for in the background: a signal stops all of it at once
        wait "$running"
        code=$?
        kill -TERM -- -"$running" 2>/dev/null # what it left running (a timed-out line's children)
        running=
        status+=("$code")
        [ "$code" = 0 ] || failed=1
        # what it printed last (ab's verdicts), on the terminal too: a call that returns little still shows it
        tail -c +$((before + 1)) "$TRIAL_OUT/log.txt" | tail -n 25 | sed "s/^/$name| /"
        if past_deadline && { [ "$code" = 124 ] || [ "$code" = 137 ]; }; then
            echo "$name: stopped at the deadline (${deadline} s)" | tee -a "$TRIAL_OUT/log.txt"
        fi
    done < <(grep '^run: ' "$patch")
    git apply -R "$patch" || die "could not take $name back: the tree holds it still"
    applied=
    if [ "$dry_run" = 0 ]; then
        echo "$name: run lines exited ${status[*]:-(none)}; log $TRIAL_OUT/log.txt" | tee -a "$summary"
        pack
    fi
done
if [ "$dry_run" = 0 ]; then # the verdicts' places once more at the end, where a call's output is kept
    echo "judge.sh: summary ($summary)"
    cat "$summary"
fi
exit "$failed"
